"""An evaluation job: low priority, stops when asked.

    python examples/jobs_evaluation.py

Runs an evaluation at priority -10 beside an inference job at the default priority (dask
runs queued work of higher priority first), then a second evaluation that is cancelled
mid-way: its attempt sees ``stop_requested`` at its next round and ends.
"""

from __future__ import annotations

import time

from distributed import Client, LocalCluster

import daskjobs.jobs as jobs

WEIGHTS = [2.0, -1.0, 0.5]


def main(store: str = ".daskjobs-cache") -> dict:
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False) as cluster,
        Client(cluster) as client,
    ):
        evaluation = jobs.submit(
            client,
            "evaluate",
            kind="evaluation",
            target="daskjobs.jobs.examples:evaluate",
            params={"weights": WEIGHTS},
            priority=-10,
            store=store,
        )
        batch = jobs.submit(
            client,
            "score-small",
            kind="inference",
            parts=3,
            target="daskjobs.jobs.examples:score",
            params={"weights": WEIGHTS, "rows": 1000},
            store=store,
        )
        result = evaluation.result()
        batch.result()
        print(f"evaluation: {result['rounds']} rounds, mse {result['mse']:.4f}")
        long = jobs.submit(
            client,
            "evaluate-long",
            kind="evaluation",
            target="daskjobs.jobs.examples:evaluate",
            params={"weights": WEIGHTS, "rounds": 2000},
            priority=-10,
            store=store,
        )
        while long.state == "queued" or not long.attempts():
            time.sleep(0.05)
        long.cancel()
        print("cancelled:", long.wait()["state"])
        while any(client.processing().values()):  # its attempt ends at its next round
            time.sleep(0.05)
        return result


if __name__ == "__main__":
    main()
