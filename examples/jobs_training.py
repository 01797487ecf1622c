"""A training job: one long task, checkpointing, resumable.

    python examples/jobs_training.py

Submits a training job to a laptop cluster, cancels it once it has checkpointed (as if
its worker were lost), retries it, and shows that the new attempt resumed from the
checkpoint instead of starting over. Everything is kept in ./.daskjobs-cache (the ledger
is ledger.sqlite there): run it twice and the second run returns the finished job.
"""

from __future__ import annotations

import time

from distributed import Client, LocalCluster

import daskjobs.jobs as jobs


def main(store: str = ".daskjobs-cache") -> dict:
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False) as cluster,
        Client(cluster) as client,
    ):
        job = jobs.submit(
            client,
            "train-linear",
            kind="training",
            target="daskjobs.jobs.examples:train",
            params={"steps": 300, "step_seconds": 0.01},
            checkpoint_every=0.5,
            store=store,
        )
        print("submitted", job.job_id)
        if job.state != "succeeded":
            while not any(h["kind"] == "checkpoint" for h in job.history()):
                time.sleep(0.1)
            job.cancel()  # the attempt stops at its next step; its output would be refused
            job.wait()
            job.retry()
        state = job.result()
        step, loss, resumed = state["step"], state["loss"], state["resumed_from"]
        print(f"step {step}, loss {loss:.4f}, resumed from step {resumed}")
        print(job.explain())
        return state


if __name__ == "__main__":
    main()
