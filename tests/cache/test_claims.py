"""Claims on a shared result store: one computation of a key across clusters."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from daskjobs.cache.claims import Claims
from daskjobs.cache.store import ResultStore


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path):
    if request.param == "local":
        return ResultStore(tmp_path / "store")
    return ResultStore(f"memory://claims-{uuid.uuid4().hex}")


class FakeClock:
    """A clock the waiter's sleeps advance: no real waiting in these tests."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_one_claim_at_a_time_and_tokens_grow(store):
    claims = Claims(store, lease=60)
    first = claims.try_claim("k")
    assert first is not None and first.token == 1
    assert claims.try_claim("k") is None  # live: nobody else gets it
    first.release(committed=False)
    latest = claims.latest("k")
    assert latest is not None and latest.released and not latest.live()
    second = claims.try_claim("k")
    assert second is not None and second.token == 2
    second.release(committed=True)
    assert claims.latest("k") is None  # committed: the key's claims are gone
    assert claims.ls() == []


def test_an_expired_claim_is_taken_over_and_its_owner_is_fenced(store):
    old = Claims(store, lease=0.05).try_claim("k")
    assert old is not None and not old.lost
    deadline = time.monotonic() + 30
    while Claims(store).latest("k").live() and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.01)
    new = Claims(store, lease=60).try_claim("k")
    assert new is not None and new.token == 2
    assert old.lost and not new.lost
    # the fenced owner's release does not touch the new claim
    old.release(committed=False)
    latest = Claims(store).latest("k")
    assert latest is not None and latest.token == 2 and latest.live()


def test_renewal_keeps_a_claim_alive(store):
    claims = Claims(store, lease=0.3)
    claim = claims.try_claim("k")
    assert claim is not None
    first = claims.latest("k")
    assert first is not None
    claim.start_renewing()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        latest = claims.latest("k")
        if latest is not None and latest.expires > first.expires:
            break
        time.sleep(0.02)
    else:
        pytest.fail("the claim was never renewed")
    assert claims.try_claim("k") is None
    claim.release(committed=False)


def test_a_waiter_loads_what_the_owner_commits(store):
    owner = Claims(store).try_claim("k")
    assert owner is not None
    clock = FakeClock()
    polls = []

    def stored() -> bool:
        polls.append(clock.now)
        if len(polls) == 4:  # the owner commits while the waiter waits
            store.put("k", 42, stage="s")
            owner.release(committed=True)
        return store.contains("k")

    state, claim = Claims(store, max_wait=60).acquire("k", stored, clock=clock, sleep=clock.sleep)
    assert (state, claim) == ("stored", None)
    assert store.get("k") == 42
    assert clock.sleeps == [0.1, 0.2, 0.4]  # backing off


def test_a_waiter_gives_up_after_max_wait(store):
    owner = Claims(store, lease=3600).try_claim("k")
    assert owner is not None
    clock = FakeClock()
    state, claim = Claims(store, max_wait=10).acquire(
        "k", lambda: False, clock=clock, sleep=clock.sleep
    )
    assert (state, claim) == ("gave-up", None)
    assert clock.now == pytest.approx(10)
    assert max(clock.sleeps) <= 2.0


def test_a_released_claim_is_taken_at_once(store):
    owner = Claims(store).try_claim("k")
    assert owner is not None
    owner.release(committed=False)  # failed: no entry
    clock = FakeClock()
    state, claim = Claims(store).acquire("k", lambda: False, clock=clock, sleep=clock.sleep)
    assert state == "claimed" and claim is not None and claim.token == 2
    assert clock.sleeps == []
    claim.release(committed=False)


def test_bad_settings_and_keys_are_refused(store):
    with pytest.raises(ValueError, match="lease"):
        Claims(store, lease=0)
    with pytest.raises(ValueError, match="max-wait"):
        Claims(store, max_wait=-1)
    with pytest.raises(ValueError, match="not a valid store key"):
        Claims(store).try_claim("../etc")


def test_an_unreadable_claim_counts_as_expired(tmp_path):
    store = ResultStore(tmp_path / "store")
    claims = Claims(store)
    claim = claims.try_claim("k")
    assert claim is not None
    path = claims._path("k", 1)
    with open(path, "w") as f:
        f.write("{torn")
    nxt = claims.try_claim("k")
    assert nxt is not None and nxt.token == 2


def _race(url: str, key: str, counter: str, start: float) -> str:
    store = ResultStore(url)
    while time.time() < start:
        time.sleep(0.001)
    state, claim = Claims(store, max_wait=120).acquire(key, lambda: store.contains(key))
    if state == "stored":
        return "loaded"
    with open(counter, "a") as f:  # the "work": each computation appends a line
        f.write(f"{os.getpid()}\n")
    store.put(key, "value", stage="s")
    assert claim is not None
    claim.release(committed=True)
    return "computed"


@pytest.mark.slow
def test_processes_racing_for_a_key_compute_it_once(tmp_path):
    url = str(tmp_path / "store")
    counter = str(tmp_path / "computed.txt")
    start = time.time() + 1.0
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(6) as pool:
        got = pool.starmap(_race, [(url, "feat", counter, start)] * 6)
    with open(counter) as f:
        lines = f.read().splitlines()
    assert len(lines) == 1, lines
    assert sorted(got) == ["computed"] + ["loaded"] * 5
    assert ResultStore(url).get("feat") == "value"


OWNER = """
import sys, time
from daskjobs.cache.claims import Claims
from daskjobs.cache.store import ResultStore
claim = Claims(ResultStore(sys.argv[1]), lease=float(sys.argv[2])).try_claim("feat")
assert claim is not None
claim.start_renewing()
print("claimed", flush=True)
time.sleep(3600)
"""


@pytest.mark.slow
def test_a_killed_owner_is_taken_over_after_its_lease(tmp_path):
    url = str(tmp_path / "store")
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, url, "1.0"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "claimed"
        store = ResultStore(url)
        assert Claims(store).try_claim("feat") is None  # alive and renewing
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        state, claim = Claims(store, max_wait=120).acquire("feat", lambda: store.contains("feat"))
        assert state == "claimed" and claim is not None and claim.token == 2
        with open(Claims(store)._path("feat", 1)) as f:
            assert "worker" not in json.load(f)["owner"]  # a plain process names host:pid
        claim.release(committed=False)
    finally:
        proc.kill()
        proc.wait()
