"""A worker preload for the chaos tests: ``distributed.worker.preload: [jobfaults]``.

``DASKJOBS_TEST_DROP_ACK=1`` - the worker's acknowledgement that it runs an attempt
is lost on the way (the worker believes it was sent; the ledger never hears of it),
as a launch whose reply is lost."""

from __future__ import annotations

import os
from typing import Any


def dask_setup(worker: Any) -> None:
    if os.environ.get("DASKJOBS_TEST_DROP_ACK") == "1":
        import daskjobs.jobs.runner as runner

        def lost_ack(ledger: Any, attempts: list[Any]) -> list[bool]:
            return [True] * len(attempts)  # "sent": the ledger never hears of it

        runner._ack_many = lost_ack
