"""Compare scheduling policies on a small sweep before spending node-hours.

A 2,000-task sweep on 8 nodes x 8 cores, one node 4x slower, its longest tasks
submitted last, estimates off by exp(0.3 z): run each policy with and without
backup copies and print makespan against the bounds.

    python examples/simulate_policies.py [--seed N]
"""

from __future__ import annotations

import argparse

from daskjobs.sim import lower_bound, make_policy, simulate, speed_bound
from daskjobs.sim.workloads import chapter


def main(seed: int = 0) -> list[dict[str, object]]:
    w = chapter(seed, n=2_000, n_long=8, nodes=8, cores_per_node=8)
    lb = lower_bound(w.tasks, w.cluster.total_cores) / 3600
    sb = speed_bound(w.tasks, w.cluster) / 3600
    print(f"{len(w.tasks)} tasks, {w.work / 3600:,.0f} core-h on {w.cluster.total_cores} cores")
    print(f"lower bound {lb:.2f} h, speed-weighted bound {sb:.2f} h\n")
    print(f"{'policy':<15}{'backups':>8}{'makespan h':>12}{'x bound':>9}{'waste core-h':>14}")
    rows = []
    for name in ("fifo", "lpt", "work-stealing", "node-aware"):
        for spec in (None, w.spec):
            s = simulate(w.tasks, w.cluster, make_policy(name), spec, seed=seed)
            row = {
                "policy": name,
                "backups": spec is not None,
                "makespan_h": s.makespan_h,
                "vs_speed_bound": s.makespan_h / sb,
                "waste_core_h": s.waste_core_h,
            }
            rows.append(row)
            print(
                f"{name:<15}{'yes' if spec else 'no':>8}{s.makespan_h:>12.2f}"
                f"{s.makespan_h / sb:>9.2f}{s.waste_core_h:>14.1f}"
            )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    main(parser.parse_args().seed)
