"""One preemption decision a round: ``PreemptionPolicy.decide`` on hand-built views, and the
same waiting/running scenario through the simulator and live on dask, which must agree on
the victims and on the best-effort reservation (docs/explanation/preemption.md, "One decision")."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dask
import pytest
from conftest import VALIDATE, plugin_cluster
from distributed import Client, Event
from waiting import until

import daskjobs
from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.client import explain, status
from daskjobs.policies.preemption import (
    FitResume,
    NaivePreemption,
    Placement,
    Preemption,
    PreemptionDecision,
    PreemptionPolicy,
    TeFirst,
)
from daskjobs.sim.preemption import Cluster, Job, Workload, simulate

# -- decide on hand-built views ------------------------------------------------------------


@dataclass(frozen=True)
class W:
    jid: Any
    cls: str
    gpus: float
    arrival: float
    preemptions: int = 0
    promised: int | None = None
    node: int | None = None
    where: frozenset[int] | None = None
    run: float = 10.0

    def end_at(self, t: float) -> float:
        return t + self.run


@dataclass(frozen=True)
class J:
    jid: Any
    cls: str
    gpus: float


@dataclass
class R:
    job: J
    node: int
    started: float
    end: float
    lost: float
    preemptions: int = 0
    group: Any = None

    def lost_at(self, t: float) -> float:
        return self.lost


@dataclass
class N:
    index: int
    free: float
    gpus: float = 4
    promised: float = 0.0


def be(jid: str, node: int, gpus: float, end: float, lost: float, group: Any = None) -> R:
    return R(J(jid, "be", gpus), node, 0.0, end, lost, group=group)


def test_one_round_places_preempts_holds_and_says_why() -> None:
    """Two nodes of 4 GPUs, each with one free. In TE-first order: te1 (1 GPU) fits;
    te2 (2 GPUs) fits nowhere and preempts the cheapest victim; big (4 GPUs, BE) fits
    nowhere and holds the node where it starts first; small (1 GPU, BE) would fit only on
    that node and is kept off it."""
    nodes = [N(0, 1), N(1, 1)]
    running = [
        be("a", 0, 3, end=50.0, lost=900.0),
        be("b", 1, 1, end=20.0, lost=10.0),
        be("c", 1, 2, end=30.0, lost=500.0),
    ]
    waiting = [
        W("small", "be", 1, 4.0),
        W("big", "be", 4, 3.0),
        W("te2", "te", 2, 2.0),
        W("te1", "te", 1, 1.0),
    ]
    d = FitResume(min_runtime=0).decide(waiting, running, nodes, 100.0)
    assert isinstance(d, PreemptionDecision)
    assert [(p.job.jid, p.node) for p in d.placements] == [("te1", 0)]
    (pre,) = d.preemptions
    assert (pre.job.jid, pre.node, [v.job.jid for v in pre.victims]) == ("te2", 1, ["b"])
    assert pre.lost == 10.0 and "preempts b on node 1" in pre.reason
    # node 0 has 4 once a (at 50) and te1, placed in this round (at 100 + 10), end; node 1
    # never has 4 while 2 of its units are promised to te2 (-1 + 1 + 2 = 2): node 0 is held
    (hold,) = d.reservations
    assert (hold.job.jid, hold.node) == ("big", 0) and "holds node 0" in hold.reason
    assert [(w.job.jid, w.reason) for w in d.waits] == [("small", "fits nowhere (fit-resume)")]
    # the decisions in the order they were made; the last word on each job
    assert [type(s) for s in d.steps()] == [Placement, Preemption]
    assert set(d.reasons()) == {"te1", "te2", "big", "small"}
    assert d.victims == tuple(pre.victims)


def test_without_the_reservation_nothing_is_held_and_small_jobs_pass() -> None:
    nodes = [N(0, 1)]
    running = [be("a", 0, 3, end=50.0, lost=0.0)]
    waiting = [W("big", "be", 4, 1.0), W("small", "be", 1, 2.0)]
    held = FitResume().decide(waiting, running, nodes, 0.0)
    assert [h.job.jid for h in held.reservations] == ["big"] and held.placements == ()
    free = FitResume(reservation=False).decide(waiting, running, nodes, 0.0)
    assert free.reservations == () and [p.job.jid for p in free.placements] == ["small"]


def test_a_promise_is_kept_once_its_victims_have_left() -> None:
    waiting = [W("te", "te", 2, 0.0, promised=0)]
    # victims still yielding: 1 free, 2 promised
    d = FitResume().decide(waiting, [], [N(0, 1, promised=2)], 5.0)
    assert d.placements == () and "yielding on node 0" in d.waits[0].reason
    d = FitResume().decide(waiting, [], [N(0, 2, promised=2)], 6.0)
    (p,) = d.placements
    assert p.kept and p.node == 0


def test_a_victims_gang_yields_whole_and_signalled_runs_are_never_chosen() -> None:
    nodes = [N(0, 0), N(1, 0)]
    running = [
        be("g0", 0, 2, end=math.inf, lost=1.0, group="train-7"),
        be("g1", 1, 2, end=math.inf, lost=1.0, group="train-7"),
        be("x", 0, 2, end=math.inf, lost=0.5),
    ]
    te = [W("te", "te", 2, 0.0)]
    # x loses least, but it was already asked to yield
    d = FitResume(min_runtime=0).decide(te, running, nodes, 9.0, signalled={"x"})
    (pre,) = d.preemptions
    assert [v.job.jid for v in pre.victims] == ["g0"]
    assert [r.job.jid for r in pre.group] == ["g1"]  # the rest of its gang
    assert [v.job.jid for v in d.victims] == ["g0", "g1"]
    # a second interactive job in the same round finds nothing left to preempt
    two = [W("te", "te", 2, 0.0), W("te2", "te", 2, 1.0)]
    d = FitResume(min_runtime=0).decide(two, running, nodes, 9.0, signalled={"x"})
    assert [p.job.jid for p in d.preemptions] == ["te"]
    assert d.waits[0].job.jid == "te2" and "no victims" in d.waits[0].reason


def test_where_and_the_node_a_job_is_queued_on() -> None:
    nodes = [N(0, 2), N(1, 1)]
    # best fit is node 1; a job queued on node 0 (which has room) stays there
    d = TeFirst().decide([W("q", "be", 1, 0.0, node=0)], [], nodes, 0.0)
    assert d.placements[0].node == 0 and "where it is queued" in d.placements[0].reason
    d = TeFirst().decide([W("f", "be", 1, 0.0)], [], nodes, 0.0)
    assert d.placements[0].node == 1
    # a job that may use only node 0
    d = TeFirst().decide([W("r", "be", 1, 0.0, where=frozenset({0}))], [], nodes, 0.0)
    assert d.placements[0].node == 0


def test_victims_that_do_not_make_room_are_refused_naming_the_policy() -> None:
    class Wrong(NaivePreemption):
        name = "wrong"

        def victims(self, job: Any, nodes: Any, running: Any, now: float) -> Any:
            return 0, [running[0]]  # 1 GPU for a 2-GPU job

    running = [be("a", 0, 1, end=9.0, lost=0.0), be("b", 0, 3, end=9.0, lost=0.0)]
    with pytest.raises(RuntimeError, match="policy wrong: victims do not make room on 0"):
        Wrong().decide([W("te", "te", 2, 0.0)], running, [N(0, 0)], 1.0)


def test_a_policy_without_preemption_only_places_and_waits() -> None:
    d = PreemptionPolicy().decide(
        [W("te", "te", 2, 0.0), W("be", "be", 1, 1.0)], [], [N(0, 1)], 0.0
    )
    assert [p.job.jid for p in d.placements] == ["be"] and d.preemptions == ()
    assert d.reservations == () and [w.job.jid for w in d.waits] == ["te"]


# -- the same scenario in the simulator and live ---------------------------------------------
#
# Three nodes of 2 GPUs, each running two best-effort jobs of one GPU (expected ends from
# their estimates: node 0 at 40 and 60 s, node 1 never, node 2 at 30 and 50 s). Only c (on
# node 1) checkpoints often. Then a best-effort job of two GPUs and an interactive job of one
# arrive. The policy (fit-resume) preempts c (the least work lost) for the interactive job,
# and holds node 2 for the big job (it starts there first: node 1's freed GPU is promised).

RUNNING = {  # name: (node, run time alone / estimate, checkpoints often)
    "a": (0, 40.0, False),
    "b": (0, 60.0, False),
    "c": (1, 1000.0, True),
    "d": (1, 1000.0, False),
    "e": (2, 30.0, False),
    "f": (2, 50.0, False),
}
EXPECTED = {"victims": ["c"], "victims_node": 1, "held": "big", "held_node": 2}


@dataclass
class Recorder:
    """Wraps a policy's ``decide``: every decision, in order."""

    policy: PreemptionPolicy
    decisions: list[PreemptionDecision] = field(default_factory=list)

    def __post_init__(self) -> None:
        decide = self.policy.decide

        def recording(*args: Any, **kwargs: Any) -> PreemptionDecision:
            d = decide(*args, **kwargs)
            self.decisions.append(d)
            return d

        self.policy.decide = recording  # type: ignore[method-assign]

    def first(self, name: Callable[[Any], str]) -> dict[str, Any]:
        """The first preemption's victims and node, the first hold's job and node."""
        pre = next(p for d in self.decisions for p in d.preemptions)
        hold = next(h for d in self.decisions for h in d.reservations)
        return {
            "victims": sorted(name(v.job.jid) for v in pre.victims),
            "victims_node": pre.node,
            "held": name(hold.job.jid),
            "held_node": hold.node,
        }


def test_the_simulator_decides_the_scenario() -> None:
    names = [*RUNNING, "big", "te"]
    jobs = [
        Job(i, "be", 0.0, 1, dur, 1.0 if often else None)
        for i, (_, dur, often) in enumerate(RUNNING.values())
    ]
    jobs += [Job(6, "be", 10.0, 2, 10.0), Job(7, "te", 10.0, 1, 1.0)]
    rec = Recorder(FitResume(min_runtime=0))
    run = simulate(Workload(Cluster(3, 2, grace=0.5, restore=0.0), tuple(jobs)), rec.policy)
    # the jobs ran where the scenario says (best fit, in arrival order)
    placed = {names[p.job.jid]: p.node for d in rec.decisions for p in d.placements}
    assert {k: placed[k] for k in RUNNING} == {k: v[0] for k, v in RUNNING.items()}
    assert rec.first(lambda jid: names[jid]) == EXPECTED
    assert run["first_start"][6] == 50.0  # the big job starts on node 2 when f ends


def be_run(name: str, often: bool) -> str:
    """A best-effort task that runs until its stop event is set; ``often``: it
    checkpoints every step and yields when asked."""
    stop = Event(f"stop-{name}")
    state = daskjobs.restore(default={"steps": 0})
    while not stop.is_set():
        time.sleep(0.02)
        state["steps"] += 1
        if often:
            daskjobs.checkpoint(state)
            if daskjobs.preempted():
                raise daskjobs.Preempted()
    return name


def started_at(name: str) -> float:
    return time.time()


def be_start(name: str) -> float:
    """A best-effort task that records its start and ends at once."""
    return time.time()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Path]:
    with dask.config.set({"daskjobs.store": str(tmp_path / "store")}):
        yield tmp_path / "store"


def test_live_dask_decides_the_scenario_as_the_simulator_and_enacts_the_hold(
    store: Path,
) -> None:
    """The same scenario on a LocalCluster of 3 workers with 2 GPUs each (node i is the
    i-th worker by address): the plugin's decisions preempt c and hold the third worker for
    the big task, as the simulator's do. The hold is enacted: a later one-GPU best-effort
    task does not take the GPU that frees on the held worker (it starts only after the big
    task), and the big task starts there."""
    plugin = JobsPlugin(
        policy="fifo",
        preemption={"enabled": True, "min_runtime": 0, "grace": "10s", "interval": "20ms"},
    )
    assert plugin.preemptor is not None
    rec = Recorder(plugin.preemptor.policy)
    with (
        dask.config.set(VALIDATE),
        plugin_cluster(plugin, n_workers=3, threads_per_worker=4, resources={"GPU": 2}) as cl,
        Client(cl) as c,
    ):
        workers = sorted(c.scheduler_info()["workers"])
        futures = {}
        for name, (node, est, often) in RUNNING.items():
            with dask.annotate(resources={"GPU": 1}, estimate=est):
                futures[name] = c.submit(
                    be_run, name, often, key=name, workers=[workers[node]], pure=False
                )
        pe = plugin.preemptor
        assert pe is not None
        until(lambda: len(pe.runs) == 6, "the six best-effort tasks did not all start")
        # c has checkpointed well after its start: it loses least by far
        until(
            lambda: pe.checkpoints.get("c", 0.0) > pe.runs["c"].started + 0.5,
            "c did not checkpoint",
        )
        with dask.annotate(resources={"GPU": 2}, estimate=10.0):
            big = c.submit(be_start, "big", key="big")
        with dask.annotate(resources={"GPU": 1}, job_class="te", estimate=1.0):
            te = c.submit(started_at, "te", key="te")
        te.result(timeout=60)
        until(lambda: "big" in pe.held, "the big task was not held")
        assert rec.first(str) == EXPECTED
        held = workers[EXPECTED["held_node"]]
        assert pe.held["big"] == held
        sched = cl.scheduler
        until(lambda: sched.tasks["big"].processing_on is not None, "big is not queued")
        assert sched.tasks["big"].processing_on.address == held  # dask's own state
        # the decision's reasons, as explain and the audit trail show them
        assert explain(c, "big")["preemption"].startswith("holds node 2")
        audit = {e["action"]: e for e in plugin.audit.events}
        assert audit["preempt-hold"]["reason"].startswith("holds node 2")
        assert "preempts c on node 1" in audit["preempt-requested"]["reason"]
        # a later best-effort task of one GPU; then e ends: a GPU frees on the held worker
        with dask.annotate(resources={"GPU": 1}, estimate=1.0):
            late = c.submit(be_start, "late", key="late")
        Event("stop-e", client=c).set()
        futures["e"].result(timeout=30)
        seen = len(rec.decisions)
        until(lambda: len(rec.decisions) >= seen + 3, "no decision after e ended")
        assert not late.done()  # kept off the GPU held for big
        assert "late" in pe.reasons and pe.held.get("big") == held
        Event("stop-f", client=c).set()  # big fits on the held worker now
        big_start = big.result(timeout=30)
        for name in RUNNING:
            Event(f"stop-{name}", client=c).set()
        late_start = late.result(timeout=30)
        c.gather(list(futures.values()))
        st = status(c)
        assert st["errors"] == {}
    assert big_start < late_start
    pre = st["preemption"]
    assert pre["requested"] == 1 and pre["yielded"] == 1 and pre["ignored"] == 0
    assert pre["held"] == {}  # the hold ended when big started
