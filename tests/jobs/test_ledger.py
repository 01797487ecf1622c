"""The jobs ledger on both backends (an SQLite file and a PostgreSQL database): the
state machines as conditional updates, idempotent repeats, fencing tokens, leases,
scheduler epochs, committed outputs exactly once, migrations, and races between
writers holding their own connections."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from daskjobs.jobs import (
    ATTEMPT_MOVES,
    JOB_MOVES,
    SCHEMA_VERSION,
    Fenced,
    JobSpec,
    Ledger,
    LedgerError,
    StaleTransition,
)


class Clock:
    def __init__(self, t: float = 1_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ledger(ledger_url: str, clock: Clock) -> Iterator[Ledger]:
    led = Ledger(ledger_url, clock=clock)
    yield led
    led.close()


def infer(parts: int = 3, **kw: Any) -> JobSpec:
    return JobSpec("score", kind="inference", parts=parts, target="m:f", **kw)


# -- specification ---------------------------------------------------------------------


def test_job_identity_is_its_content() -> None:
    a = JobSpec("train", kind="training", params={"lr": 0.1, "layers": 4})
    b = JobSpec("train", kind="training", params={"layers": 4, "lr": 0.1})
    c = JobSpec("train", kind="training", params={"layers": 4, "lr": 0.2})
    assert a.job_id == b.job_id != c.job_id
    assert a.job_id.startswith("train-")
    assert JobSpec.from_json(a.to_json()) == a


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "JobSpec.name"),
        ({"kind": "batch"}, "expected one of training, inference, evaluation"),
        ({"kind": "training", "parts": 2}, "a training job has one part"),
        ({"kind": "inference", "parts": 0}, "JobSpec.parts"),
        ({"retries": -1}, "JobSpec.retries"),
        ({"deadline": float("nan")}, "JobSpec.deadline"),
        ({"checkpoint_every": 0}, "JobSpec.checkpoint_every"),
        ({"resources": {"GPU": float("inf")}}, "JobSpec.resources['GPU']"),
        ({"params": {"f": object()}}, "JSON-able"),
        ({"team": ""}, "JobSpec.team"),
    ],
)
def test_bad_specifications_are_named(kwargs: dict[str, Any], message: str) -> None:
    kwargs = {"name": "j", **kwargs}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        JobSpec(**kwargs)


# -- schema ------------------------------------------------------------------------------


def test_migrate_is_idempotent_and_versioned(ledger_url: str) -> None:
    led = Ledger(ledger_url, migrate=False)
    assert led.version() == 0
    assert led.migrate() == SCHEMA_VERSION
    assert led.migrate() == SCHEMA_VERSION  # twice: nothing to do
    assert led.version() == SCHEMA_VERSION
    assert led.epoch() == 0
    led.close()


def test_a_version_1_ledger_is_migrated_and_keeps_its_jobs(ledger_url: str) -> None:
    """A ledger written by the first release (schema 1: no index of a part's attempts,
    no outputs kept in the ledger) is brought to version 2 with its jobs and outputs."""
    old = Ledger(ledger_url)
    e = old.acquire_epoch()
    job = old.submit(infer(2), e).job_id
    a = old.start_attempt(job, 0, "w", 30, e)
    assert old.commit_output(job, 0, a.token, "file:///out/0") is True
    with old.engine.begin() as conn:  # back to what version 1 wrote
        conn.exec_driver_sql("DROP INDEX ix_daskjobs_attempts_part")
        conn.exec_driver_sql("ALTER TABLE daskjobs_outputs DROP COLUMN value")
        conn.exec_driver_sql("ALTER TABLE daskjobs_jobs DROP COLUMN parts")
        conn.exec_driver_sql("ALTER TABLE daskjobs_jobs DROP COLUMN committed")
        conn.exec_driver_sql("UPDATE daskjobs_meta SET value = '1' WHERE key = 'schema_version'")
    old.close()
    stale = Ledger(ledger_url, migrate=False)  # a worker's: it does not migrate
    with pytest.raises(LedgerError, match=r"schema version 1, this daskjobs writes 2"):
        stale.acquire_epoch()
    stale.close()
    led = Ledger(ledger_url)
    assert led.version() == SCHEMA_VERSION == 2
    import sqlalchemy as sa

    inspect = sa.inspect(led.engine)
    assert "ix_daskjobs_attempts_part" in {
        i["name"] for i in inspect.get_indexes("daskjobs_attempts")
    }
    assert "value" in {c["name"] for c in inspect.get_columns("daskjobs_outputs")}
    assert led.outputs(job) == {0: "file:///out/0"}  # nothing lost
    e = led.acquire_epoch()
    led.move_job(job, "queued", "running", e, "an attempt started")
    b = led.start_attempt(job, 1, "w", 30, e)
    assert led.commit_outputs([(job, 1, b.token, "ledger:x")], values=[b"\x80v"]) == [True]
    assert led.output_values(job) == {1: b"\x80v"}
    # the migration counted part 0 as committed: part 1 was the last
    assert led.job(job).state == "succeeded"
    led.close()


def test_a_newer_schema_is_refused(ledger: Ledger) -> None:
    with ledger.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE daskjobs_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(LedgerError, match=r"schema version 99 is newer .* upgrade daskjobs"):
        ledger.migrate()
    with pytest.raises(LedgerError, match=r"schema version 99 is newer .* upgrade daskjobs"):
        Ledger(ledger.url)


def test_unmigrated_ledger_says_so(ledger_url: str) -> None:
    led = Ledger(ledger_url, migrate=False)
    with pytest.raises(LedgerError, match=r"schema version 0, .* call Ledger.migrate\(\)"):
        led.acquire_epoch()
    assert led.version() == 0  # nothing written
    led.close()


def test_bad_url_is_named() -> None:
    with pytest.raises(LedgerError, match=r"cannot use 'nosuchdb://x'.*expected sqlite"):
        Ledger("nosuchdb://x")


# -- jobs ----------------------------------------------------------------------------------


def test_submit_twice_is_one_job(ledger: Ledger, clock: Clock) -> None:
    e = ledger.acquire_epoch("s1")
    spec = infer()
    first = ledger.submit(spec, e)
    clock.t += 5
    again = ledger.submit(spec, e)
    assert first == again
    assert first.state == "queued" and first.spec == spec
    assert [j.job_id for j in ledger.jobs()] == [spec.job_id]
    assert ledger.missing_parts(spec.job_id) == [0, 1, 2]
    assert [h["to_state"] for h in ledger.history(spec.job_id)] == ["queued"]


def test_job_moves_are_conditional_and_idempotent(ledger: Ledger) -> None:
    e = ledger.acquire_epoch()
    job = ledger.submit(infer(), e).job_id
    assert ledger.move_job(job, "queued", "running", e, "started") is True
    assert ledger.move_job(job, "queued", "running", e) is False  # repeated: a no-op
    assert ledger.move_job(job, "running", "cancelled", e, "user") is True
    with pytest.raises(StaleTransition, match="expected state 'queued', found 'cancelled'"):
        ledger.move_job(job, "queued", "running", e)
    with pytest.raises(ValueError, match="cannot move from 'succeeded' to 'queued'"):
        ledger.move_job(job, "succeeded", "queued", e)
    with pytest.raises(StaleTransition, match="found None"):
        ledger.move_job("nope", "queued", "running", e)
    states = [(h["from_state"], h["to_state"]) for h in ledger.history(job)]
    assert states == [(None, "queued"), ("queued", "running"), ("running", "cancelled")]


def test_state_machines_are_closed() -> None:
    for moves in (JOB_MOVES, ATTEMPT_MOVES):
        for targets in moves.values():
            assert targets <= set(moves)


# -- attempts, tokens, outputs ---------------------------------------------------------------


def test_each_attempt_gets_a_higher_token(ledger: Ledger, clock: Clock) -> None:
    e = ledger.acquire_epoch()
    job = ledger.submit(infer(), e).job_id
    a1 = ledger.start_attempt(job, 1, "w1", 10, e)
    assert (a1.token, a1.state, a1.lease_until) == (1, "launching", clock.t + 10)
    with pytest.raises(StaleTransition, match=f"attempt {a1.attempt_id} holds it"):
        ledger.start_attempt(job, 1, "w2", 10, e)
    ledger.move_attempt(a1.attempt_id, a1.token, "launching", "running", e)
    ledger.move_attempt(a1.attempt_id, a1.token, "running", "failed", e, "ValueError")
    a2 = ledger.start_attempt(job, 1, "w2", 10, e)
    assert a2.token == 2
    other = ledger.start_attempt(job, 0, "w1", 10, e)
    assert other.token == 1  # tokens count per part
    with pytest.raises(LedgerError, match="has no part 7"):
        ledger.start_attempt(job, 7, "w1", 10, e)


def test_job_status_is_what_the_separate_reads_say(ledger: Ledger) -> None:
    """job_status (what Job.status shows, read at once) agrees with job, attempts,
    outputs and missing_parts, for parts with several attempts, parts committed and parts
    never started; the parts of one run and of scattered ones are selected alike."""
    e = ledger.acquire_epoch()
    other = ledger.submit(infer(parts=2, params={"other": 1}), e).job_id
    ledger.start_attempts([(other, 0), (other, 1)], 10, e)
    job = ledger.submit(infer(parts=9), e).job_id
    ledger.move_job(job, "queued", "running", e)
    first = ledger.start_attempts([(job, p) for p in range(2, 7)], 10, e)  # one run
    assert [a.part for a in first] == [2, 3, 4, 5, 6]
    ledger.move_attempt(first[0].attempt_id, first[0].token, "launching", "failed", e, "boom")
    again = ledger.start_attempts([(job, 2), (job, 0), (job, 8)], 10, e)  # scattered
    assert [(a.part, a.token) for a in again] == [(2, 2), (0, 1), (8, 1)]
    done = [a for a in first[1:] + again if a.part in (0, 2, 5)]
    ledger.commit_outputs([(job, a.part, a.token, f"file:///out/{a.part}") for a in done])
    status = ledger.job_status(job)
    assert status["job"] == ledger.job(job)
    fields = ("attempt_id", "part", "token", "state", "worker", "lease_until", "started")
    fields += ("updated", "reason")
    assert status["attempts"] == [{f: getattr(a, f) for f in fields} for a in ledger.attempts(job)]
    assert [(a["part"], a["token"]) for a in status["attempts"]] == [
        (0, 1),
        (2, 1),
        (2, 2),
        (3, 1),
        (4, 1),
        (5, 1),
        (6, 1),
        (8, 1),
    ]
    assert status["outputs"] == ledger.outputs(job) == {p: f"file:///out/{p}" for p in (0, 2, 5)}
    assert status["missing"] == ledger.missing_parts(job) == [1, 3, 4, 6, 7, 8]
    with pytest.raises(LedgerError, match="no job 'nope'"):
        ledger.job_status("nope")


def test_attempt_moves_check_the_token(ledger: Ledger) -> None:
    e = ledger.acquire_epoch()
    job = ledger.submit(infer(), e).job_id
    a = ledger.start_attempt(job, 0, "w1", 10, e)
    with pytest.raises(StaleTransition, match="token 5 is stale"):
        ledger.move_attempt(a.attempt_id, 5, "launching", "running", e)
    assert ledger.move_attempt(a.attempt_id, a.token, "launching", "running", e) is True
    assert ledger.move_attempt(a.attempt_id, a.token, "launching", "running", e) is False
    with pytest.raises(ValueError, match="cannot move from 'lost' to 'running'"):
        ledger.move_attempt(a.attempt_id, a.token, "lost", "running", e)


def test_outputs_are_committed_once(ledger: Ledger) -> None:
    e = ledger.acquire_epoch()
    job = ledger.submit(infer(parts=2), e).job_id
    ledger.move_job(job, "queued", "running", e)
    a = ledger.start_attempt(job, 0, "w1", 10, e, state="running")
    assert ledger.commit_output(job, 0, a.token, "file:///out/0") is True
    assert ledger.commit_output(job, 0, a.token, "file:///out/0") is False  # a retried call
    assert [x.state for x in ledger.attempts(job)] == ["succeeded"]
    with pytest.raises(StaleTransition, match="committed"):
        ledger.start_attempt(job, 0, "w2", 10, e)
    assert ledger.job(job).state == "running"
    assert ledger.missing_parts(job) == [1]
    b = ledger.start_attempt(job, 1, "w2", 10, e, state="running")
    assert ledger.commit_output(job, 1, b.token, "file:///out/1") is True
    assert ledger.outputs(job) == {0: "file:///out/0", 1: "file:///out/1"}
    assert ledger.job(job).state == "succeeded"
    assert ledger.missing_parts(job) == []


def test_a_lost_attempt_cannot_commit(ledger: Ledger, clock: Clock) -> None:
    """The paused worker: its lease expires, its part goes to another attempt; the old
    attempt's commit is refused whether or not the new one has started or finished."""
    e = ledger.acquire_epoch()
    job = ledger.submit(infer(parts=1), e).job_id
    ledger.move_job(job, "queued", "running", e)
    old = ledger.start_attempt(job, 0, "w1", 10, e, state="running")
    clock.t += 5
    assert ledger.renew(old.attempt_id, old.token, 10, e) is True  # lease to t+15
    clock.t += 9
    assert ledger.expire(e) == []  # still within the renewed lease
    clock.t += 5
    [lost] = ledger.expire(e)
    assert (lost.attempt_id, lost.state, lost.reason) == (old.attempt_id, "lost", "lease expired")
    assert ledger.renew(old.attempt_id, old.token, 10, e) is False  # its owner should stop
    with pytest.raises(StaleTransition, match="token 1 may no longer commit"):
        ledger.commit_output(job, 0, old.token, "file:///late")
    new = ledger.start_attempt(job, 0, "w2", 10, e, state="running")
    assert new.token == old.token + 1
    with pytest.raises(StaleTransition, match="a newer attempt holds the part"):
        ledger.commit_output(job, 0, old.token, "file:///late")
    assert ledger.commit_output(job, 0, new.token, "file:///good") is True
    with pytest.raises(StaleTransition, match="token 2 committed it; token 1 may not"):
        ledger.commit_output(job, 0, old.token, "file:///late")
    assert ledger.outputs(job) == {0: "file:///good"}
    reasons = [
        (h["from_state"], h["to_state"], h["reason"]) for h in ledger.history(old.attempt_id)
    ]
    assert reasons == [(None, "running", "part 0 token 1"), ("running", "lost", "lease expired")]


def test_unknown_launches_hold_their_part(ledger: Ledger, clock: Clock) -> None:
    """A launch whose reply was lost is ``unknown``: no second attempt starts while it
    holds its part; its worker's report adopts it (running), its commit is accepted,
    and without either it is lost when its lease runs out."""
    e = ledger.acquire_epoch()
    job = ledger.submit(infer(parts=2), e).job_id
    a = ledger.start_attempt(job, 0, None, 5, e)
    ledger.move_attempt(a.attempt_id, a.token, "launching", "unknown", e, "launch timed out")
    with pytest.raises(StaleTransition, match="found 'unknown'"):
        ledger.start_attempt(job, 0, "w2", 10, e)
    assert ledger.ack(a.attempt_id, a.token, "w1", 10) is True
    [adopted] = ledger.attempts(job)
    assert (adopted.state, adopted.worker, adopted.lease_until) == ("running", "w1", clock.t + 10)
    assert ledger.history(a.attempt_id)[-1]["reason"] == "its worker reported it (w1)"
    assert ledger.commit_output(job, 0, a.token, "file:///it-ran") is True

    b = ledger.start_attempt(job, 1, None, 5, e)
    ledger.move_attempt(b.attempt_id, b.token, "launching", "unknown", e, "launch timed out")
    clock.t += 4
    assert ledger.renew_many([(b.attempt_id, b.token)], 5, e) == 1  # dask still holds it
    clock.t += 4
    assert ledger.expire(e) == []
    clock.t += 2
    [lost] = ledger.expire(e)
    assert (lost.attempt_id, lost.state) == (b.attempt_id, "lost")
    assert ledger.ack(b.attempt_id, b.token, "w1", 10) is False  # too late: do not run it
    assert ledger.start_attempt(job, 1, None, 5, e).token == 2


def test_cancel_retry_and_failure(ledger: Ledger, clock: Clock) -> None:
    e = ledger.acquire_epoch()
    job = ledger.submit(infer(parts=2, retries=1), e).job_id
    ledger.move_job(job, "queued", "running", e)
    a = ledger.start_attempt(job, 0, "w1", 10, e, state="running")
    assert ledger.cancel(job, reason="user asked") is True
    assert ledger.cancel(job) is False
    assert [x.state for x in ledger.attempts(job)] == ["cancelled"]
    assert ledger.renew(a.attempt_id, a.token, 10) is False  # the worker learns it
    with pytest.raises(StaleTransition, match="found 'cancelled'"):
        ledger.commit_output(job, 0, a.token, "file:///x")
    assert ledger.runnable() == []
    clock.t += 1
    assert ledger.retry(job) is True
    assert ledger.retry(job) is False
    assert [(j.job_id, p, f) for j, p, f in ledger.runnable()] == [(job, 0, 0), (job, 1, 0)]
    b = ledger.start_attempt(job, 0, "w1", 10, e, state="running")
    clock.t += 1
    assert ledger.end_attempt(b.attempt_id, b.token, "failed", e, "ValueError: boom") is True
    assert ledger.end_attempt(b.attempt_id, b.token, "failed", e) is False
    assert [(p, f) for _, p, f in ledger.runnable()] == [(0, 1), (1, 0)]
    assert ledger.fail(job, e, "part 0 failed 2 times") is True
    assert ledger.job(job).state == "failed" and ledger.job(job).reason == "part 0 failed 2 times"
    clock.t += 1
    assert ledger.retry(job) is True
    assert [(p, f) for _, p, f in ledger.runnable()] == [(0, 0), (1, 0)]  # a fresh budget
    with pytest.raises(LedgerError, match="no job 'nope'"):
        ledger.cancel("nope")


def test_runnable_orders_by_priority_then_age(ledger: Ledger, clock: Clock) -> None:
    e = ledger.acquire_epoch()
    low = ledger.submit(JobSpec("low", priority=0), e).job_id
    clock.t += 1
    high = ledger.submit(JobSpec("high", priority=5), e).job_id
    clock.t += 1
    later = ledger.submit(JobSpec("later", priority=0), e).job_id
    assert [j.job_id for j, _, _ in ledger.runnable()] == [high, low, later]
    started = ledger.start_attempts([(high, 0), (low, 0), (high, 0)], 10, e)
    assert [a.job_id for a in started] == [high, low]  # the second start of high refused
    assert [j.job_id for j, _, _ in ledger.runnable()] == [later]


def test_checkpoints_are_fenced(ledger: Ledger) -> None:
    e = ledger.acquire_epoch()
    job = ledger.submit(JobSpec("train", kind="training", checkpoint_every=60), e).job_id
    old = ledger.start_attempt(job, 0, "w1", 10, e, state="running")
    ledger.commit_checkpoint(job, 0, old.token, "ckpt-1")
    assert ledger.checkpoint(job, 0) == "ckpt-1"
    ledger.end_attempt(old.attempt_id, old.token, "lost", e, "worker left")
    new = ledger.start_attempt(job, 0, "w2", 10, e, state="running")
    assert ledger.checkpoint(job, 0) == "ckpt-1"  # the new attempt resumes from it
    with pytest.raises(StaleTransition, match="token 1 is stale"):
        ledger.commit_checkpoint(job, 0, old.token, "ckpt-stale")
    ledger.commit_checkpoint(job, 0, new.token, "ckpt-2")
    assert ledger.checkpoint(job, 0) == "ckpt-2"


def test_metrics_per_team(ledger: Ledger, clock: Clock) -> None:
    e = ledger.acquire_epoch()
    a = ledger.submit(infer(parts=2, team="alpha"), e).job_id
    b = ledger.submit(JobSpec("ev", team="beta"), e).job_id
    ledger.move_job(a, "queued", "running", e)
    clock.t += 4
    x = ledger.start_attempt(a, 0, "w", 1, e, state="running")
    clock.t += 2
    ledger.expire(e)
    y = ledger.start_attempt(a, 0, "w", 10, e, state="running")
    with pytest.raises(StaleTransition):
        ledger.commit_output(a, 0, x.token, "late")
    ledger.commit_output(a, 0, y.token, "ok")
    m = ledger.metrics()
    assert m["alpha"]["jobs"] == {"running": 1}
    assert m["alpha"]["attempts"] == {"lost": 1, "succeeded": 1}
    assert (m["alpha"]["retries"], m["alpha"]["lost"], m["alpha"]["refused"]) == (1, 1, 1)
    assert m["alpha"]["queue_delay"] == pytest.approx(4.0)
    assert (m["alpha"]["expired"], m["alpha"]["queue_delay_count"]) == (1, 1)
    assert m["beta"] == {
        "jobs": {"queued": 1},
        "attempts": {},
        "retries": 0,
        "lost": 0,
        "expired": 0,
        "refused": 0,
        "queue_delay": None,
        "queue_delay_count": 0,
    }
    assert b in {j.job_id for j in ledger.jobs(team="beta")}


def test_a_newer_scheduler_fences_the_older(ledger_url: str, clock: Clock) -> None:
    first = Ledger(ledger_url, clock=clock)
    e1 = first.acquire_epoch("scheduler-1")
    job = first.submit(infer(parts=1), e1).job_id
    a = first.start_attempt(job, 0, "w1", 10, e1, state="running")
    second = Ledger(ledger_url, clock=clock)
    e2 = second.acquire_epoch("scheduler-2")
    assert e2 == e1 + 1
    for write in (
        lambda: first.move_job(job, "queued", "running", e1),
        lambda: first.start_attempt(job, 0, "w1", 10, e1),
        lambda: first.expire(e1),
        lambda: first.submit(infer(parts=2), e1),
    ):
        with pytest.raises(Fenced, match=f"epoch is {e2}, this writer holds {e1}"):
            write()
    # a worker's commit is fenced by its token, not by the scheduler's epoch
    assert second.commit_output(job, 0, a.token, "file:///x") is True
    epochs = [(h["to_state"], h["reason"]) for h in second.history() if h["kind"] == "epoch"]
    assert epochs == [("1", "took over"), ("2", "took over")]
    assert [h["ref"] for h in second.history() if h["kind"] == "epoch"] == [
        "scheduler-1",
        "scheduler-2",
    ]
    first.close()
    second.close()


# -- races between writers ---------------------------------------------------------------------


def _race(url: str, n: int, work: Callable[[Ledger, int], Any], clock: Clock) -> list[Any]:
    """Run ``work(ledger, i)`` in ``n`` threads at once, each with its own ledger
    (engine, connections); the results or exceptions in order."""
    ledgers = [Ledger(url, clock=clock) for _ in range(n)]
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = work(ledgers[i], i)
        except Exception as e:
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for led in ledgers:
        led.close()
    return out


def test_racing_starts_give_one_attempt(ledger: Ledger, clock: Clock) -> None:
    e = ledger.acquire_epoch()
    job = ledger.submit(infer(parts=1), e).job_id
    results = _race(ledger.url, 6, lambda led, i: led.start_attempt(job, 0, f"w{i}", 10, e), clock)
    started = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, StaleTransition)]
    assert len(started) == 1 and len(refused) == 5, results
    assert [a.token for a in ledger.attempts(job)] == [1]


def test_racing_commits_make_one_output_visible(ledger: Ledger, clock: Clock) -> None:
    """Attempts 1..4 of one part, each lost but the last; all four commit at once (and
    the expiry sweeper runs beside them): only the current token's output is visible."""
    e = ledger.acquire_epoch()
    job = ledger.submit(infer(parts=1), e).job_id
    tokens = []
    for _ in range(4):
        a = ledger.start_attempt(job, 0, "w", 10, e, state="running")
        tokens.append(a.token)
        if len(tokens) < 4:
            ledger.move_attempt(a.attempt_id, a.token, "running", "lost", e, "worker left")

    def work(led: Ledger, i: int) -> Any:
        if i == 4:
            return led.expire(e)
        return led.commit_output(job, 0, tokens[i], f"file:///out/{tokens[i]}")

    results = _race(ledger.url, 5, work, clock)
    assert results[3] is True, results
    assert all(isinstance(r, StaleTransition) for r in results[:3]), results
    assert ledger.outputs(job) == {0: "file:///out/4"}


def test_takeover_during_writes(ledger: Ledger, clock: Clock) -> None:
    """A new epoch taken while writers run: every write either lands before the
    takeover (with the old epoch) or is fenced; none lands after it."""
    e = ledger.acquire_epoch("old")
    specs = [JobSpec(f"job{i}", kind="evaluation") for i in range(20)]

    def work(led: Ledger, i: int) -> Any:
        if i == 0:
            return led.acquire_epoch("new")
        done = []
        for spec in specs[(i - 1) * 5 : i * 5]:
            try:
                led.submit(spec, e)
                done.append(spec.job_id)
            except Fenced:
                break
        return done

    results = _race(ledger.url, 5, work, clock)
    new_epoch = results[0]
    assert new_epoch == e + 1
    history = ledger.history()
    takeover = next(h["id"] for h in history if h["kind"] == "epoch" and h["to_state"] == "2")
    for h in history:
        if h["kind"] == "job":
            assert h["epoch"] == e and h["id"] < takeover, h
    submitted = {j for r in results[1:] for j in r}
    assert {j.job_id for j in ledger.jobs()} == submitted


@pytest.mark.slow
def test_random_operations_keep_the_invariants(ledger: Ledger, clock: Clock) -> None:
    """Random starts, moves, renewals, expiries and commits (stale ones included) on a
    few parts: at most one live attempt and at most one output per part, the output's
    token is the highest issued for that part, and a refused call changed nothing."""
    rng = random.Random(7)
    e = ledger.acquire_epoch()
    job = ledger.submit(infer(parts=3), e).job_id
    ledger.move_job(job, "queued", "running", e)
    issued: dict[int, list[int]] = {0: [], 1: [], 2: []}
    ids: dict[tuple[int, int], str] = {}
    for _ in range(150):
        part = rng.randrange(3)
        op = rng.choice(["start", "run", "renew", "tick", "expire", "commit", "lose"])
        before = ledger.history()
        try:
            if op == "start":
                a = ledger.start_attempt(job, part, "w", rng.choice([1, 5]), e)
                issued[part].append(a.token)
                ids[(part, a.token)] = a.attempt_id
            elif op == "tick":
                clock.t += rng.choice([0.5, 2, 6])
            elif op == "expire":
                ledger.expire(e)
            elif issued[part]:
                token = rng.choice(issued[part])
                aid = ids[(part, token)]
                if op == "run":
                    ledger.move_attempt(aid, token, "launching", "running", e)
                elif op == "renew":
                    ledger.renew(aid, token, 5, e)
                elif op == "lose":
                    ledger.move_attempt(aid, token, "running", "lost", e, "chaos")
                else:
                    ledger.commit_output(job, part, token, f"file:///{part}/{token}")
        except StaleTransition:
            # a refused call wrote nothing but the record of a refused commit
            extra = ledger.history()[len(before) :]
            assert ledger.history()[: len(before)] == before
            assert all(h["to_state"] == "refused" for h in extra), extra
        attempts = ledger.attempts(job)
        for p in range(3):
            live = [
                a
                for a in attempts
                if a.part == p and a.state in ("launching", "running", "unknown")
            ]
            assert len(live) <= 1
        for p, location in ledger.outputs(job).items():
            assert location == f"file:///{p}/{max(issued[p])}"
    assert ledger.job(job).state == ("succeeded" if not ledger.missing_parts(job) else "running")


def test_transactions_roll_back_whole(ledger: Ledger) -> None:
    """A commit whose attempt moved mid-transaction leaves neither an output nor a
    succeeded attempt behind (one transaction)."""
    e = ledger.acquire_epoch()
    job = ledger.submit(infer(parts=1), e).job_id
    a = ledger.start_attempt(job, 0, "w", 10, e, state="running")
    with ledger.engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE daskjobs_outputs"))
    with pytest.raises(sa.exc.DBAPIError):
        ledger.commit_output(job, 0, a.token, "file:///x")
    assert [x.state for x in ledger.attempts(job)] == ["running"]


# -- the service's rules (pure) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "task", "handed", "seen", "step"),
    [
        (None, "processing", None, None, "drop"),  # the ledger ended it
        ("running", "processing", 0.0, 99.0, "wait"),  # its worker's heartbeats hold it
        ("launching", "queued", None, None, "renew"),  # dask holds it
        ("launching", "processing", 99.0, 99.5, "renew"),  # handed over just now
        ("launching", "processing", 50.0, 99.5, "unknown"),  # never acknowledged
        ("unknown", "processing", 50.0, 99.5, "renew"),  # dask says its worker has it
        ("unknown", "processing", 50.0, 90.0, "wait"),  # that worker went silent
        ("launching", None, None, None, "wait"),  # dask does not know it (a restart)
        ("unknown", "memory", 50.0, None, "wait"),  # finished: its commit decides
    ],
)
def test_next_step(state: str | None, task: str | None, handed: Any, seen: Any, step: str) -> None:
    from daskjobs.jobs import next_step

    got = next_step(
        state,
        task_state=task,
        handed=handed,
        now=100.0,
        launch_timeout=30.0,
        worker_seen=seen,
        lease=5.0,
    )
    assert got == step


@pytest.mark.parametrize("write", ["end_attempt", "ack_many", "cancel"])
def test_a_write_that_waited_on_a_move_of_the_attempt_applies_to_it(
    postgres_url: str, write: str
) -> None:
    """PostgreSQL runs writers concurrently: one that read an attempt's live state while
    another transaction moved it (a worker's acknowledgement, launching -> running; the
    service's reconciling, launching -> unknown) then waited for that transaction. The
    attempt is still live: ending it, acknowledging it or cancelling its job applies to
    it, and is neither refused (a worker told to stop a live attempt) nor skipped (an
    attempt left running in a cancelled job)."""
    led = Ledger(postgres_url)
    e = led.acquire_epoch()
    job = led.submit(infer(1), e).job_id
    a = led.start_attempt(job, 0, None, 30, e)
    assert a.state == "launching"
    moved = "unknown" if write == "ack_many" else "running"
    db = sa.engine.make_url(postgres_url).database
    other = sa.create_engine(postgres_url)
    result: dict[str, Any] = {}

    def call() -> None:
        if write == "end_attempt":
            result["r"] = led.end_attempt(a.attempt_id, a.token, "lost", e, "test")
        elif write == "ack_many":
            result["r"] = led.ack_many([(a.attempt_id, a.token, "w1")], 30)
        else:
            result["r"] = led.cancel(job, e, "test")

    with other.connect() as conn, conn.begin():
        conn.execute(
            sa.text("UPDATE daskjobs_attempts SET state = :s WHERE attempt_id = :a"),
            {"s": moved, "a": a.attempt_id},
        )
        t = threading.Thread(target=call)
        t.start()
        # the write waits for this transaction's lock on the attempt's row
        deadline = time.monotonic() + 30
        while not conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = :db "
                "AND wait_event_type = 'Lock'"
            ),
            {"db": db},
        ).scalar():
            assert time.monotonic() < deadline and t.is_alive(), result
            time.sleep(0.01)
    t.join(30)
    other.dispose()
    state = led.attempts(job)[0].state
    if write == "end_attempt":
        assert (result["r"], state) == (True, "lost")
    elif write == "ack_many":
        assert (result["r"], state) == ([True], "running")
    else:
        assert (result["r"], state) == (True, "cancelled")
    led.close()


def test_expiry_and_placement_rules() -> None:
    from daskjobs.jobs.model import may_expire, responsive

    assert not may_expire(100.0, None, 5.0)  # unreachable now
    assert not may_expire(100.0, 97.0, 5.0)  # back for less than a lease
    assert may_expire(100.0, 95.0, 5.0)
    assert responsive({"a": 99.0, "b": 99.5}, 100.0, 5.0) is None  # all fine: anywhere
    assert responsive({"a": 90.0, "b": 99.5}, 100.0, 5.0) == ["b"]  # a is silent
    assert responsive({"a": 90.0, "b": 80.0}, 100.0, 5.0) == ["a"]  # b silent 10 s longer
    assert responsive({"a": 90.0, "b": 89.0}, 100.0, 5.0) is None  # nobody heard: alike
    # silent for more than a third of a lease: a paused worker whose attempt was just lost
    assert responsive({"a": 97.0, "b": 99.5}, 100.0, 5.0) == ["b"]
    # a loaded scheduler hears the healthy worker late too (0.9 s, over a third of a 2 s
    # lease): the part still does not go back to the paused one
    assert responsive({"paused": 97.9, "healthy": 99.1}, 100.0, 2.0) == ["healthy"]
    assert responsive({}, 100.0, 2.0) is None


def test_commit_outputs_decides_each_part_on_its_own(ledger: Ledger) -> None:
    """A worker process's batch: parts never acknowledged commit straight from
    ``launching``, a lost one is refused and recorded, a repeat is a no-op, and the job
    succeeds once its last part is in - all in one transaction."""
    e = ledger.acquire_epoch()
    job = ledger.submit(infer(3), e).job_id
    a0, a1, a2 = ledger.start_attempts([(job, p) for p in range(3)], 30, e)
    assert {a.state for a in (a0, a1, a2)} == {"launching"}
    ledger.move_job(job, "queued", "running", e, "an attempt started")  # as the service does
    ledger.end_attempt(a1.attempt_id, a1.token, "lost", e, "lease expired")
    batch = [(job, a.part, a.token, f"ledger:{a.part}") for a in (a0, a1, a2)]
    first = ledger.commit_outputs(batch, values=[b"0", b"1", b"2"])
    assert first[0] is True and first[2] is True
    assert isinstance(first[1], StaleTransition) and "may no longer commit" in str(first[1])
    assert ledger.commit_outputs(batch[:1], values=[b"0"]) == [False]  # repeated: a no-op
    assert ledger.output_values(job) == {0: b"0", 2: b"2"}
    assert [h["to_state"] for h in ledger.history(f"{job}/1")] == ["refused"]
    assert ledger.job(job).state != "succeeded"  # part 1 is missing
    b1 = ledger.start_attempts([(job, 1)], 30, e)[0]
    assert b1.token == a1.token + 1
    assert ledger.commit_outputs([(job, 1, b1.token, "ledger:1")], values=[b"1"]) == [True]
    assert ledger.job(job).state == "succeeded"
    states = {a.attempt_id: a.state for a in ledger.attempts(job)}
    assert states[a0.attempt_id] == states[b1.attempt_id] == "succeeded"
