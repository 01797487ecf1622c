"""Replay a recorded run under every policy: what would it have taken otherwise?

``examples/data/replay_small.jsonl`` was recorded on a LocalCluster of 3 workers
x 2 threads with the plugin's ``lpt`` policy: 60 backtests of log-normal
duration from two teams, worker 0 three times slower (see
``benchmarks/bench_replay.py``, ``record``). This script checks the replay against
the recording, then replays it under each policy, with and without backups at
1.5x and 2.5x, and once more without the slow worker.

    python examples/replay_trace.py [TRACE]
"""

from __future__ import annotations

import sys
from pathlib import Path

from daskjobs.replay import POLICIES, load, replay

TRACE = Path(__file__).resolve().parent / "data" / "replay_small.jsonl"


def main(path: Path = TRACE) -> list[dict[str, object]]:
    loaded = load(path)
    same = replay(loaded)
    slow = {w.address: round(w.speed, 2) for w in loaded.workers if w.speed != 1.0}
    print(f"{len(loaded.tasks)} tasks on {loaded.nodes} workers x {loaded.cores_per_node} threads")
    print(f"fitted overhead {loaded.fit.overhead * 1e3:.2f} ms/task; slow workers {slow or 'none'}")
    print(
        f"recorded {loaded.recorded.makespan:.3f} s, replayed under {same.policy} "
        f"{same.makespan:.3f} s ({same.error * 100:+.1f}%)\n"
    )
    print(f"{'policy':<15}{'backups at':>11}{'slow':>6}{'makespan s':>12}{'backups':>9}")
    rows: list[dict[str, object]] = []
    for name in POLICIES:
        for spec in (None, 1.5, 2.5):
            for no_slow in (False, True) if spec is None else (False,):
                r = replay(loaded, name, speculation=spec, no_slow=no_slow)
                rows.append({**r.row(), "no_slow": no_slow})
                print(
                    f"{name:<15}{'off' if spec is None else f'{spec}x':>11}"
                    f"{'no' if no_slow else 'yes':>6}{r.makespan:>12.3f}"
                    f"{r.schedule.backups_launched:>9}"
                )
    return rows


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else TRACE)
