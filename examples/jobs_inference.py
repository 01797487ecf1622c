"""A batch-inference job: N partitions, each replayable, each committed once.

    python examples/jobs_inference.py

Scores 8 partitions with fixed weights; then submits the same job again: the same
identity comes back and nothing runs twice (the outputs are committed in the ledger).
"""

from __future__ import annotations

from distributed import Client, LocalCluster

import daskjobs.jobs as jobs

SPEC = {
    "kind": "inference",
    "parts": 8,
    "target": "daskjobs.jobs.examples:score",
    "params": {"weights": [2.0, -1.0, 0.5]},
}


def main(store: str = ".daskjobs-cache") -> list:
    with (
        LocalCluster(n_workers=2, threads_per_worker=2, processes=False) as cluster,
        Client(cluster) as client,
    ):
        job = jobs.submit(client, "score-batch", store=store, **SPEC)
        outputs = job.result()
        for out in outputs:
            print(f"partition {out['partition']}: {out['rows']} rows, mse {out['mse']:.4f}")
        again = jobs.submit(client, "score-batch", store=store, **SPEC)
        tokens = [a["token"] for a in again.attempts()]
        print(f"resubmitted: same job {again.job_id == job.job_id}, attempts {len(tokens)}")
        return outputs


if __name__ == "__main__":
    main()
