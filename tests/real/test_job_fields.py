"""Every field of a job refused at submission, with an error naming it, on a real
``dask scheduler --preload daskjobs.preload`` with the ledger on each backend (the
``ledger_url`` fixture): wrong types and values of each :class:`~daskjobs.jobs.JobSpec`
field through ``jobs.submit`` (checked on the client) and the same specs sent to the
scheduler's jobs service as they are (checked there again), a target whose module or
function the workers lack, and a job over the scheduler's admission limits. Nothing is
recorded, no database error or SQL text reaches the client, the scheduler logs no
traceback, and a good job runs afterwards."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from realcluster import PROBLEMS, RealCluster

import daskjobs.jobs as jobs
from daskjobs.errors import AdmissionRefused
from daskjobs.jobs import Ledger
from daskjobs.jobs.api import _call
from daskjobs.jobs.model import JobSpec, JobSpecError

#: Wrong types and values of each field: field -> values (each refused naming the field).
BAD: dict[str, list[Any]] = {
    "name": ["", 5, None, "x" * 201, "a\x00b", "two\nlines"],
    "kind": ["batch", 5, None, ["inference"]],
    "team": ["", 5, "t\x00", "t" * 201],  # (None: the submitting client's team)
    "parts": [0, -1, "3", 1.5, True, None, 2**31, 10**30],
    "target": [123, "nocolon", "a b:c", ":f", "m:", "m:f g", ["jobtasks:score"], None],
    "params": [5, [1, 2], "x", {"a": math.nan}, {"a": math.inf}, {1: 2}, {"": 1}, {"a": {1j}}],
    "resources": [[1], {"GPU": -1}, {"GPU": "x"}, {"": 1}, {"GPU": math.nan}, {"GPU": True}, 3],
    "priority": ["x", math.nan, math.inf, -math.inf, 1.5, 2**40, -(2**40), None, True, [1]],
    "deadline": [0, -1, math.nan, math.inf, "x", True, [1]],
    "retries": [-1, "2", 1.5, 10**6, None, True],
    "checkpoint_every": [0, -5, math.nan, "x", False],
    "job_class": ["urgent", 5, None, ["te"]],
    "accelerator": [5, "", [], [1], {"A100": 1}],
    "gpu_memory": ["lots", True, [1], "-5GB"],
    "constraint": [5, "((", "gpus >", ["x"]],
}

#: What a refusal must never show: the database's own errors and SQL text.
RAW = re.compile(r"DataError|IntegrityError|OperationalError|ProgrammingError|INSERT INTO|\[SQL")

GOOD = {"kind": "inference", "parts": 2, "target": "jobtasks:score"}


def _fields(field: str, value: Any) -> dict[str, Any]:
    return {**GOOD, field: value}


def _spec_json(field: str, value: Any) -> dict[str, Any]:
    """A good spec's JSON with one field replaced, as a client that skips the checks
    would send it."""
    return {**JobSpec("j", **GOOD).to_json(), field: value}


def _sendable(value: Any) -> bool:
    """Whether dask's messages carry ``value`` as it is (msgpack)."""
    import msgpack

    try:
        msgpack.packb(value, use_bin_type=True)
    except Exception:
        return False
    return True


def _start(real_cluster: Callable[..., RealCluster], url: str, store: Path, **kw: Any) -> Any:
    config = {
        "daskjobs": {
            "store": str(store),
            "jobs": {"interval": "100ms", "lease": "5s"},
            **kw,
        }
    }
    return real_cluster(
        n_workers=1,
        preload="daskjobs.preload",
        preload_args=["--daskjobs-ledger", url],
        config=config,
    )


# (ledger_url before real_cluster: the cluster stops before its database is dropped)


def test_every_field_is_refused_at_submission_naming_it(
    ledger_url: str, real_cluster: Callable[..., RealCluster], tmp_path: Path
) -> None:
    rc = _start(real_cluster, ledger_url, tmp_path / "store")
    refused: list[str] = []
    with rc.client() as c:
        for field, values in BAD.items():
            for value in values:
                where = f"{field}={value!r}"
                # through the API: refused where the spec is made, on the client
                with pytest.raises(JobSpecError) as info:
                    jobs.submit(c, "j", **_fields(field, value))
                assert info.value.field == field, (where, info.value)
                assert not RAW.search(str(info.value)), (where, info.value)
                refused.append(str(info.value))
                # as sent by a client that skips the checks: refused by the scheduler
                spec = _spec_json(field, value)
                if not _sendable(spec):
                    continue
                with pytest.raises(JobSpecError) as info:
                    _call(c, "submit", spec=spec)
                assert info.value.field == field, (where, info.value)
                assert not RAW.search(str(info.value)), (where, info.value)
        # fields it does not know: named, through the API and raw
        with pytest.raises(JobSpecError, match=r"unknown field.*'prio'"):
            jobs.submit(c, "j", prio=1, **GOOD)
        with pytest.raises(JobSpecError, match=r"unknown field.*'prio'"):
            _call(c, "submit", spec={**JobSpec("j", **GOOD).to_json(), "prio": 1})
        # a target the workers cannot call: refused before anything is recorded
        with pytest.raises(JobSpecError, match=r"'nosuchmodule:f' cannot be called.*w0"):
            jobs.submit(c, "j", kind="inference", target="nosuchmodule:f")
        with pytest.raises(JobSpecError, match=r"'jobtasks:nosuch' cannot be called.*nosuch"):
            jobs.submit(c, "j", kind="inference", target="jobtasks:nosuch")
        with pytest.raises(JobSpecError, match=r"'jobtasks:os' cannot be called.*not a function"):
            jobs.submit(c, "j", kind="inference", target="jobtasks:os")
        assert jobs.list(c) == []  # nothing recorded
        assert Ledger(ledger_url).jobs() == []
        # the scheduler goes on serving: a good job runs
        assert jobs.submit(c, "ok", **GOOD).result(timeout=90) == [0, 10]
        assert jobs.submit(c, "ok", priority=-(2**31), **GOOD).result(timeout=90) == [0, 10]
    assert len(refused) == sum(map(len, BAD.values()))
    problems = [ln for ln in rc.log("scheduler").splitlines() if PROBLEMS.search(ln)]
    assert problems == [], problems
    assert not RAW.search(rc.log("scheduler"))


def test_a_job_over_the_admission_limits_is_refused_naming_the_limit(
    ledger_url: str, real_cluster: Callable[..., RealCluster], tmp_path: Path
) -> None:
    """A job of more parts than ``admission.job-parts`` (10**9 parts, the default limit)
    and one of more bytes than ``admission.job-bytes`` are refused before the ledger
    records anything; the scheduler goes on serving."""
    rc = _start(real_cluster, ledger_url, tmp_path / "store", admission={"job-bytes": "64KiB"})
    with rc.client() as c:
        with pytest.raises(AdmissionRefused) as info:
            jobs.submit(c, "huge", kind="inference", parts=10**9, target="jobtasks:score")
        err = info.value
        assert (err.key, err.limit, err.size) == ("daskjobs.admission.job-parts", 100000, 10**9)
        assert "daskjobs.admission.job-parts = 100,000 parts" in str(err)
        with pytest.raises(AdmissionRefused, match=r"daskjobs\.admission\.job-bytes = 64\.0 KiB"):
            jobs.submit(c, "fat", target="jobtasks:score", params={"blob": "x" * 100_000})

        def big(attempt: Any, blob: bytes = b"y" * 100_000) -> int:
            return len(blob)

        with pytest.raises(AdmissionRefused, match=r"job-bytes"):
            jobs.submit(c, "closure", big)
        assert Ledger(ledger_url).jobs() == []
        assert jobs.submit(c, "ok", **GOOD).result(timeout=90) == [0, 10]
        assert c.submit(sum, [1, 2]).result(timeout=90) == 3
    assert not RAW.search(rc.log("scheduler"))
