"""``daskjobs ledger ls|show|cancel|retry|migrate`` on both ledger backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from daskjobs.cli import main
from daskjobs.jobs import SCHEMA_VERSION, JobSpec, Ledger


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_ls_show_cancel_retry(ledger_url: str) -> None:
    assert run("ledger", "migrate", "--ledger", ledger_url)[1].endswith(
        f"schema version {SCHEMA_VERSION}\n"
    )
    led = Ledger(ledger_url)
    e = led.acquire_epoch()
    a = led.submit(JobSpec("score", kind="inference", parts=2, target="m:f", team="alpha"), e)
    b = led.submit(JobSpec("train", kind="training", target="m:g", team="beta"), e)
    x = led.start_attempt(a.job_id, 0, "tcp://w1", 10, e, state="running")
    led.commit_output(a.job_id, 0, x.token, "out-0")

    code, out = run("ledger", "ls", "--ledger", ledger_url)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["job", "kind", "team", "state"]
    assert a.job_id in lines[2] and "1/2" in lines[2] and "alpha" in lines[2]
    assert b.job_id in lines[3] and "0/1" in lines[3]
    code, out = run("ledger", "ls", "--ledger", ledger_url, "--team", "beta", "--json")
    assert [j["job_id"] for j in json.loads(out)] == [b.job_id]
    code, out = run("ledger", "ls", "--ledger", ledger_url, "--state", "nope")
    assert code == 2 and "expected one of queued, running" in out

    code, out = run("ledger", "show", "--ledger", ledger_url, "score")  # by name
    assert code == 0, out
    assert f"job {a.job_id}: queued" in out and "tcp://w1" in out and "missing parts: 1" in out
    code, out = run("ledger", "show", "--ledger", ledger_url, "nope")
    assert code == 1 and "no job 'nope' in the ledger" in out

    code, out = run("ledger", "cancel", "--ledger", ledger_url, b.job_id[:8])  # by prefix
    assert (code, out) == (0, f"cancelled {b.job_id}\n")
    code, out = run("ledger", "cancel", "--ledger", ledger_url, b.job_id)
    assert code == 1 and "is cancelled: nothing to cancel" in out
    code, out = run("ledger", "retry", "--ledger", ledger_url, b.job_id)
    assert (code, out) == (0, f"queued {b.job_id} again\n")
    assert led.job(b.job_id).state == "queued"
    history = [(h["from_state"], h["to_state"], h["reason"]) for h in led.history(b.job_id)]
    assert history[-2:] == [
        ("queued", "cancelled", "cancelled from the command line"),
        ("cancelled", "queued", "retried from the command line"),
    ]
    led.close()


def test_no_ledger_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DASKJOBS_STORE", str(tmp_path / "store"))
    code, out = run("ledger", "ls")
    assert code == 1 and "no jobs ledger at sqlite:///" in out and "give --ledger URL" in out
