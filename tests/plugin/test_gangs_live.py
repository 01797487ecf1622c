"""Resource vectors, accelerator types and gangs live on dask (docs/explanation/resources.md).

Fake inventories (``daskjobs.inventory`` by worker name); dask's validation on. Order,
causality and counts only: where a task ran, what ran before what, how many started
together."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dask
import pytest
from conftest import VALIDATE, plugin_cluster
from distributed import Client, get_worker
from distributed.diagnostics.plugin import SchedulerPlugin
from waiting import until

import daskjobs
from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.client import status
from daskjobs.plugin.workers.worker import STARTED_TOPIC, StartReporter

INVENTORY = {
    "by-name": {
        "0": {"accelerator": "A100", "gpus": 2, "gpu_memory": "40GB"},
        "1": {"accelerator": "V100", "gpus": 2, "gpu_memory": "16GB"},
        "*": {"accelerator": "A100", "gpus": 2, "gpu_memory": "40GB"},
    }
}
RESOURCES = {"enabled": True, "interval": "50ms"}


def where(i: int, seconds: float = 0.01) -> tuple[int, str]:
    time.sleep(seconds)
    return i, str(get_worker().name)


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Path]:
    with dask.config.set({"daskjobs.store": str(tmp_path / "store")}):
        yield tmp_path / "store"


def _cluster(plugin: Any, n_workers: int = 2, **kw: Any) -> Any:
    return plugin_cluster(
        plugin, n_workers=n_workers, threads_per_worker=4, resources={"GPU": 2}, **kw
    )


@contextmanager
def _gpu_client(plugin: Any, n_workers: int = 2, inventory: Any = INVENTORY) -> Iterator[Client]:
    """A client of an in-process cluster of ``n_workers`` x 2 GPUs whose scheduler runs
    ``plugin``, validation on, once every worker has reported ``inventory``."""
    with (
        dask.config.set({**VALIDATE, "daskjobs.inventory": inventory}),
        _cluster(plugin, n_workers=n_workers) as cl,
        Client(cl) as c,
    ):
        _wait_inventories(c, n_workers)
        yield c


def _placer_status(c: Client) -> dict[str, Any]:
    return c.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.plugins["daskjobs"].placer.status()
    )


def _wait_inventories(c: Client, n: int) -> None:
    deadline = time.time() + 30
    while sum(w["reported"] for w in _placer_status(c)["workers"].values()) < n:
        assert time.time() < deadline, "the workers did not report their inventories"
        time.sleep(0.02)


def _errors(c: Client) -> dict[str, int]:
    return c.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["daskjobs"].errors)


def test_a_task_never_runs_on_a_worker_lacking_what_it_asks_for() -> None:
    """Feasibility before preference: a task asking for an A100 (or 32 GB per device, or
    a constraint only the V100 worker meets) runs only where that is, even while the
    feasible worker is busy and the other one idles."""
    plugin = JobsPlugin(policy="fifo", resources=RESOURCES)
    with _gpu_client(plugin) as c:
        futures = {}
        for i in range(8):
            with dask.annotate(resources={"GPU": 1}, accelerator="A100"):
                futures[("A100", i)] = c.submit(where, i, 0.05, key=f"a100-{i}")
            with dask.annotate(resources={"GPU": 1}, gpu_memory="32GB"):
                futures[("32GB", i)] = c.submit(where, i, 0.05, key=f"mem-{i}")
            with dask.annotate(resources={"GPU": 1}, constraint="gpu_memory < '20GB'"):
                futures[("small", i)] = c.submit(where, i, 0.05, key=f"small-{i}")
            with dask.annotate(resources={"GPU": 1}, accelerator=["V100", "H100"]):
                futures[("V100", i)] = c.submit(where, i, 0.05, key=f"v100-{i}")
        ran = {k: f.result(timeout=60)[1] for k, f in futures.items()}
        expected = {"A100": "0", "32GB": "0", "small": "1", "V100": "1"}
        wrong = {k: w for k, w in ran.items() if w != expected[k[0]]}
        assert not wrong, f"tasks ran on workers lacking what they asked for: {wrong}"
        st = _placer_status(c)
        assert st["placed"] == 32
        assert _errors(c) == {}


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"resources": {"GPU": 1}, "accelerator": "H100"}, r"accelerator H100 \(it has A100\)"),
        (
            {"resources": {"GPU": 1}, "gpu_memory": "80GB"},
            r"gpu_memory 74\.51 GiB per device \(it has 37\.25 GiB\)",
        ),
        ({"resources": {"GPU": 3}}, r"GPU=3 \(it has 2\)"),
        ({"constraint": "gpus >= 8"}, r"constraint 'gpus >= 8' is false"),
        ({"resources": {"GPU": 1}, "accelerator": 5}, r"accelerator: expected a type"),
        ({"constraint": "__import__('os')"}, r"is not allowed"),
        ({"constraint": "colour == 'red'"}, r"unknown name 'colour'"),
        ({"resources": {"GPU": 1}, "gpu_memory": "lots"}, r"'lots' is not a size"),
        ({"resources": {"GPU": 1}, "gang": "g"}, r"gang 'g' needs gang_size"),
    ],
)
def test_an_impossible_or_malformed_request_fails_at_submission(
    annotations: dict[str, Any], message: str
) -> None:
    """Refused when submitted, naming what is missing, instead of waiting for ever; what
    was computed before stays."""
    plugin = JobsPlugin(policy="fifo", resources=RESOURCES)
    inventory = {"by-name": {"*": INVENTORY["by-name"]["0"]}}
    with _gpu_client(plugin, inventory=inventory) as c:
        with dask.annotate(resources={"GPU": 1}):
            before = c.submit(where, 0, key="before")
        assert before.result(timeout=30)[0] == 0
        with dask.annotate(**annotations):
            bad = c.submit(where, 1, key="bad")
        with pytest.raises(Exception, match=message):
            bad.result(timeout=30)
        assert before.result(timeout=30)[0] == 0
        assert _placer_status(c)["waiting"] == 0
        assert _errors(c) == {}


def test_a_gang_no_worker_set_can_hold_is_refused() -> None:
    """5 members of 1 GPU each on 2 workers of 2 GPUs: the gang can never start."""
    plugin = JobsPlugin(policy="fifo", resources=RESOURCES)
    with _gpu_client(plugin) as c:
        with dask.annotate(resources={"GPU": 1}, gang="big", gang_size=5):
            fs = c.map(where, range(5), key=[f"big-{i}" for i in range(5)])
        with pytest.raises(Exception, match="gang 'big' can never start"):
            fs[0].result(timeout=30)


class GangWatch(SchedulerPlugin):
    """Checks, on every true start of a gang member (the start reporter's event), that
    every member of the gang can run now: each is assigned to a worker whose GPUs are
    not held by tasks outside the gang (started and not finished)."""

    name = "gang-watch"

    def __init__(self, members: list[str], gpus_per_worker: float) -> None:
        self.members = set(members)
        self.capacity = gpus_per_worker
        self.running: dict[str, tuple[str, float]] = {}  # key -> (worker, gpus)
        self.checks: list[bool] = []
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kw: Any) -> None:
        if start == "processing":
            self.running.pop(key, None)

    def log_event(self, topic: str, msg: Any) -> None:
        if topic != STARTED_TOPIC or not isinstance(msg, dict):
            return
        key = msg.get("key")
        ts = self.scheduler.tasks.get(key)
        if ts is None or ts.processing_on is None:
            return
        gpus = float((ts.resource_restrictions or {}).get("GPU", 0))
        self.running[key] = (ts.processing_on.address, gpus)
        if key in self.members:
            self.checks.append(self._all_can_run())

    def _all_can_run(self) -> bool:
        held: dict[str, float] = {}
        for k, (w, g) in self.running.items():
            if k not in self.members:
                held[w] = held.get(w, 0.0) + g
        need: dict[str, float] = {}
        for m in self.members:
            ts = self.scheduler.tasks.get(m)
            if ts is None or ts.state == "memory":
                continue
            if ts.state != "processing":
                return False
            w = ts.processing_on.address
            need[w] = need.get(w, 0.0) + float(ts.resource_restrictions.get("GPU", 0))
        return all(held.get(w, 0.0) + n <= self.capacity for w, n in need.items())


def _gang_behind_occupiers(c: Client, stream: int = 0) -> tuple[list[Any], list[Any], list[Any]]:
    """4 one-GPU tasks with staggered ends fill the 4 GPUs; then a gang of 4 one-GPU
    members; then ``stream`` one-GPU tasks of 0.6 s (estimates exact)."""
    occupiers = []
    for i, d in enumerate((0.2, 0.35, 0.5, 0.65)):
        with dask.annotate(resources={"GPU": 1}, estimate=d):
            occupiers.append(c.submit(nap, d, key=f"occupier-{i}"))
    time.sleep(0.15)  # the occupiers hold the GPUs before the gang arrives
    with dask.annotate(resources={"GPU": 1}, gang="train-7", gang_size=4, estimate=0.3):
        gang = [c.submit(where, i, 0.3, key=f"train-7-{i}") for i in range(4)]
    tail = []
    for i in range(stream):
        with dask.annotate(resources={"GPU": 1}, estimate=0.6):
            tail.append(c.submit(nap, 0.6, key=f"stream-{i}"))
    return occupiers, gang, tail


@pytest.mark.slow
@pytest.mark.parametrize("placer", [True, False], ids=["placer", "plain-dask"])
def test_a_gang_never_starts_partially(placer: bool) -> None:
    """Checked on every member's true start: with the placer every member can run at
    once; plain dask (the control: the check can fail) starts members one by one as
    GPUs free, each holding its GPU while the others wait behind other tasks."""
    members = [f"train-7-{i}" for i in range(4)]
    watch = GangWatch(members, 2.0)
    plugin = JobsPlugin(policy="fifo", resources=RESOURCES)
    with dask.config.set({**VALIDATE, "daskjobs.inventory": INVENTORY}):
        cl = plugin_cluster(None, n_workers=2, threads_per_worker=4, resources={"GPU": 2})
        with cl, Client(cl) as c:
            c.register_plugin(watch)
            if placer:
                c.register_plugin(plugin)
                _wait_inventories(c, 2)
            else:  # plain dask, and the start reports the check needs
                c.register_plugin(StartReporter(), name="test-start-reporter")
            occupiers, gang, tail = _gang_behind_occupiers(c, stream=8)
            c.gather(occupiers + gang + tail)
            checks = c.run_on_scheduler(
                lambda dask_scheduler: dask_scheduler.plugins["gang-watch"].checks
            )
            assert len(checks) == 4  # one per member start
            if placer:
                assert all(checks), f"a member started while another could not: {checks}"
                st = _placer_status(c)
                assert st["gangs"]["train-7"]["starts"] == 1
                assert _errors(c) == {}
            else:
                assert not all(checks), "plain dask started the gang whole: no contrast"


def _start_order(c: Client) -> list[str]:
    """Tasks and gangs in the order the placer's decisions started them."""
    return c.run_on_scheduler(
        lambda dask_scheduler: [d for _, d, _ in dask_scheduler.plugins["daskjobs"].placer.starts]
    )


@pytest.mark.slow
@pytest.mark.parametrize("reservation", [True, False])
def test_a_gang_behind_a_stream_of_small_tasks_starts_with_a_reservation(
    reservation: bool,
) -> None:
    """A gang needing all 4 GPUs waits behind 4 one-GPU tasks that end one by one; 12
    more one-GPU tasks arrive after it. With the reservation the freed GPUs are held for
    the gang (a 0.6 s task would outlast the last occupier) and it starts before any of
    them; without, each freed GPU goes to the next small task and the gang starves until
    the stream runs dry."""
    plugin = JobsPlugin(policy="fifo", resources={**RESOURCES, "reservation": reservation})
    with _gpu_client(plugin) as c:
        occupiers, gang, tail = _gang_behind_occupiers(c, stream=12)
        c.gather(occupiers + gang + tail)
        order = _start_order(c)
        streams_before = sum(1 for k in order[: order.index("train-7")] if "stream" in k)
        st = _placer_status(c)
        assert _errors(c) == {}
    if reservation:
        assert streams_before == 0, order
        assert st["held_back"] > 0  # small tasks were kept off the reserved GPUs
    else:
        assert streams_before >= 10, order  # starved while the stream lasted
    assert st["gangs"]["train-7"]["starts"] == 1


def member(i: int, steps: int = 30, step_s: float = 0.05) -> dict[str, Any]:
    """A gang member that checkpoints every step and yields when asked."""
    state = daskjobs.restore(default={"step": 0, "runs": 0, "resumed_at": []})
    state["runs"] += 1
    state["resumed_at"].append(state["step"])
    while state["step"] < steps:
        if daskjobs.preempted():
            raise daskjobs.Preempted()
        time.sleep(step_s)
        state["step"] += 1
        daskjobs.checkpoint(state)
    state["worker"] = str(get_worker().name)
    state["end"] = time.time()
    return state


@pytest.mark.slow
def test_a_member_whose_worker_dies_restarts_the_whole_gang(store: Path) -> None:
    """4 members on 3 workers of 2 GPUs; the worker of one member closes mid-run: the
    others are asked to yield, and the gang starts again, whole, on the two workers left,
    each member from its checkpoint."""
    plugin = JobsPlugin(policy="fifo", resources=RESOURCES)
    with _gpu_client(plugin, n_workers=3) as c:
        with dask.annotate(resources={"GPU": 1}, gang="ddp", gang_size=4):
            fs = [c.submit(member, i, key=f"ddp-{i}") for i in range(4)]
        deadline = time.time() + 30
        while True:  # every member has checkpointed at least once
            ran = c.run_on_scheduler(
                lambda dask_scheduler: {
                    str(k): ts.processing_on.name
                    for k, ts in dask_scheduler.tasks.items()
                    if str(k).startswith("ddp-") and ts.processing_on is not None
                }
            )
            if len(ran) == 4 and (store / "daskjobs-store-v1" / "checkpoints").exists():
                break
            assert time.time() < deadline, "the gang did not start"
            time.sleep(0.05)
        time.sleep(0.3)
        victim = ran["ddp-0"]
        c.cluster.sync(c.cluster.workers[victim].close)
        results = c.gather(fs)
        st = _placer_status(c)
        assert _errors(c) == {}
    g = st["gangs"]["ddp"]
    assert g["starts"] == 2 and g["restarts"] == 1, g
    assert all(r["step"] == 30 for r in results)
    assert all(r["worker"] != str(victim) for r in results)
    # every member ran twice and the second run resumed from its checkpoint
    assert all(r["runs"] >= 2 for r in results), results
    assert all(r["resumed_at"][-1] > 0 for r in results), results


@pytest.mark.slow
def test_the_simulator_and_the_plugin_start_demands_in_the_same_order() -> None:
    """One deterministic scenario, live and in :mod:`daskjobs.sim.gangs`, the same
    GangPolicy object deciding: 4 one-GPU tasks with staggered ends fill 2 workers of 2
    GPUs; a gang of 4 arrives, then a 0.1 s task (it ends before the gang needs the GPUs:
    backfilled ahead of it), then 6 tasks of 0.6 s (kept behind it by the reservation)."""
    from daskjobs.policies.resources import GangPolicy, Inventory, Request
    from daskjobs.sim.gangs import Demand, Node, simulate_gangs

    occupiers = (0.2, 0.35, 0.5, 0.65)
    plugin = JobsPlugin(policy="fifo", resources=RESOURCES)
    with _gpu_client(plugin) as c:
        fs = []
        for i, d in enumerate(occupiers):
            with dask.annotate(resources={"GPU": 1}, estimate=d):
                fs.append(c.submit(nap, d, key=f"occupier-{i}"))
        time.sleep(0.15)
        with dask.annotate(resources={"GPU": 1}, gang="train-7", gang_size=4, estimate=0.3):
            fs += [c.submit(nap, 0.3, key=f"train-7-{i}") for i in range(4)]
        with dask.annotate(resources={"GPU": 1}, estimate=0.1):
            fs.append(c.submit(nap, 0.1, key="quick"))
        for i in range(6):
            with dask.annotate(resources={"GPU": 1}, estimate=0.6):
                fs.append(c.submit(nap, 0.6, key=f"stream-{i}"))
        c.gather(fs)
        live = _start_order(c)
        assert _errors(c) == {}

    inv = Inventory(resources={"GPU": 2.0}, accelerator="A100", gpus=2)
    nodes = [Node(0, "h0", inv), Node(1, "h1", inv)]
    one = Request(resources={"GPU": 1.0})
    demands = [
        Demand(f"occupier-{i}", 0.001 * i, (one,), d, estimate=d) for i, d in enumerate(occupiers)
    ]
    demands.append(Demand("train-7", 0.15, (one,) * 4, 0.3, estimate=0.3))
    demands.append(Demand("quick", 0.151, (one,), 0.1, estimate=0.1))
    demands += [Demand(f"stream-{i}", 0.152 + 0.001 * i, (one,), 0.6, 0.6) for i in range(6)]
    sim = simulate_gangs(nodes, demands, GangPolicy(reservation=True))
    assert live == sim.starts, (live, sim.starts)
    assert sim.starts.index("quick") < sim.starts.index("train-7") < sim.starts.index("stream-0")


def span(seconds: float) -> tuple[float, float]:
    t0 = time.time()
    time.sleep(seconds)
    return t0, time.time()


def test_a_worker_that_loses_a_device_is_reconciled_never_double_allocated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker with 2 GPUs runs 2 one-GPU tasks; its inventory then reports 1 GPU (a new
    version): nothing new starts there until both have ended, then one at a time."""
    plugin = JobsPlugin(policy="fifo", resources=RESOURCES)
    two = {"accelerator": "A100", "gpus": 2, "gpu_memory": "40GB"}
    monkeypatch.setenv("DASKJOBS_INVENTORY", json.dumps(two))
    with (
        dask.config.set(VALIDATE),
        _cluster(plugin, n_workers=1) as cl,
        Client(cl) as c,
    ):
        _wait_inventories(c, 1)
        with dask.annotate(resources={"GPU": 1}):
            first = [c.submit(span, 0.6, key=f"first-{i}") for i in range(2)]
        deadline = time.time() + 30
        while _placer_status(c)["placed"] < 2:
            assert time.time() < deadline
            time.sleep(0.01)
        monkeypatch.setenv("DASKJOBS_INVENTORY", json.dumps({**two, "gpus": 1}))
        c.run(lambda dask_worker: dask_worker.plugins["daskjobs-inventory"].refresh())
        while next(iter(_placer_status(c)["workers"].values()))["inventory_version"] < 2:
            assert time.time() < deadline, "the new inventory was not reported"
            time.sleep(0.01)
        with dask.annotate(resources={"GPU": 1}):
            later = [c.submit(span, 0.1, key=f"later-{i}") for i in range(4)]
        a = c.gather(first)
        b = sorted(c.gather(later))
        w = next(iter(_placer_status(c)["workers"].values()))
        assert _errors(c) == {}
    assert w["capacity"] == {"GPU": 1.0} and w["inventory_version"] == 2
    assert all(s >= max(e for _, e in a) for s, _ in b), "placed on a device it lost"
    assert all(b[i + 1][0] >= b[i][1] for i in range(3)), f"two ran at once on 1 GPU: {b}"


@pytest.mark.realcluster
def test_on_real_processes_a_killed_members_worker_restarts_the_whole_gang(
    real_cluster: Any, tmp_path: Path
) -> None:
    """The plugin preloaded into a real ``dask scheduler``, 3 ``dask worker`` processes
    with 2 GPUs each (inventories from the shared config), dask's defaults and
    validation: a gang of 4 starts whole; the worker of two of its members is killed
    (SIGKILL) mid-run; the two others yield, and the gang starts again, whole, on the
    workers left, every member from its checkpoint, with an unpreempted run's results."""
    import realtasks

    a100 = {"accelerator": "A100", "gpus": 2, "gpu_memory": "40GB"}
    config = {
        "daskjobs": {
            "policy": "fifo",
            "store": str(tmp_path / "store"),
            "resources": {"enabled": True, "interval": "50ms"},
            "inventory": {"by-name": {"*": a100}},
        }
    }
    rc = real_cluster(n_workers=3, nthreads=4, config=config, worker_resources="GPU=2")
    with rc.client() as c:
        deadline = time.time() + 60
        while sum(w["reported"] for w in status(c)["resources"]["workers"].values()) < 3:
            assert time.time() < deadline, "the workers did not report their inventories"
            time.sleep(0.05)
        with dask.annotate(resources={"GPU": 1}, gang="ddp", gang_size=4):
            fs = [c.submit(realtasks.train, i, 40, 0.05, key=f"ddp-{i}") for i in range(4)]

        def members(dask_scheduler: Any) -> dict[str, str]:
            return {
                str(k): ts.processing_on.name
                for k, ts in dask_scheduler.tasks.items()
                if str(k).startswith("ddp-") and ts.processing_on is not None
            }

        while len(c.run_on_scheduler(members)) < 4:
            assert time.time() < deadline, "the gang did not start"
            time.sleep(0.05)

        def checkpointed(dask_scheduler: Any) -> list[str]:
            placer = dask_scheduler.plugins["daskjobs"].placer
            return sorted(str(k) for k in placer.checkpoints if str(k).startswith("ddp-"))

        # every member has stored a checkpoint (a worker reports it once it is written)
        while len(c.run_on_scheduler(checkpointed)) < 4:
            assert time.time() < deadline, "the members did not checkpoint"
            time.sleep(0.05)
        victim = c.run_on_scheduler(members)["ddp-0"]
        rc.kill(victim)
        results = c.gather(fs)
        st = status(c)
    assert st["errors"] == {}
    g = st["resources"]["gangs"]["ddp"]
    assert g["starts"] == 2 and g["restarts"] == 1, g
    assert [(r["step"], r["acc"]) for r in results] == [(40, i * sum(range(40))) for i in range(4)]
    assert all(r["runs"] >= 2 for r in results), results
    assert [n for n in ("w0", "w1", "w2") if rc.alive(n)] == sorted({"w0", "w1", "w2"} - {victim})
    assert rc.problems() == []


def test_a_task_that_names_workers_runs_only_there_and_an_impossible_pair_is_refused() -> None:
    """``workers=`` is part of feasibility: a one-GPU task restricted to the V100 worker
    runs there; asking for an A100 on the V100 worker can never run."""
    plugin = JobsPlugin(policy="fifo", resources=RESOURCES)
    with _gpu_client(plugin) as c:
        v100 = next(a for a, w in c.scheduler_info()["workers"].items() if str(w["name"]) == "1")
        with dask.annotate(resources={"GPU": 1}):
            fs = [c.submit(where, i, key=f"pinned-{i}", workers=[v100]) for i in range(4)]
        assert {f.result(timeout=30)[1] for f in fs} == {"1"}
        with dask.annotate(resources={"GPU": 1}, accelerator="A100"):
            bad = c.submit(where, 9, key="a100-on-v100", workers=[v100])
        with pytest.raises(Exception, match="not one of the workers the task names"):
            bad.result(timeout=30)
        assert _errors(c) == {}


def test_a_gang_waits_for_all_its_members_and_cancelled_tasks_leave_nothing_behind() -> None:
    """Members submitted in two calls: none starts before the last arrives. Held tasks
    the client cancels are forgotten by the placer (no waiting left, no error)."""
    plugin = JobsPlugin(policy="fifo", resources=RESOURCES)
    with _gpu_client(plugin) as c:
        with dask.annotate(resources={"GPU": 1}, gang="late", gang_size=3):
            first = [c.submit(where, i, key=f"late-{i}") for i in range(2)]
        time.sleep(0.3)  # several decisions pass
        assert _placer_status(c)["placed"] == 0
        assert all(f.status == "pending" for f in first)
        with dask.annotate(resources={"GPU": 1}, gang="late", gang_size=3):
            last = c.submit(where, 2, key="late-2")
        assert len(c.gather([*first, last])) == 3
        assert _placer_status(c)["gangs"]["late"]["starts"] == 1
        # a gang that can never complete (2 of 3 members), cancelled
        with dask.annotate(resources={"GPU": 1}, gang="orphan", gang_size=3):
            orphans = [c.submit(where, i, key=f"orphan-{i}") for i in range(2)]
        time.sleep(0.2)
        c.cancel(orphans)
        deadline = time.time() + 30
        while (st := _placer_status(c))["waiting"] or "orphan" in st["gangs"]:
            assert time.time() < deadline, st
            time.sleep(0.02)
        with dask.annotate(resources={"GPU": 2}):
            after = c.submit(where, 9, key="after")
        assert after.result(timeout=30)[0] == 9
        assert _errors(c) == {}


def test_a_worker_without_an_inventory_reports_no_accelerator_not_an_error() -> None:
    """No DASKJOBS_INVENTORY, no daskjobs.inventory, no nvidia-smi: the worker's report is
    its threads, memory and dask resources; plain resource requests run, an accelerator
    request is refused naming it."""
    plugin = JobsPlugin(policy="fifo", resources=RESOURCES)
    with dask.config.set(VALIDATE), _cluster(plugin) as cl, Client(cl) as c:
        _wait_inventories(c, 2)
        workers = _placer_status(c)["workers"].values()
        assert all("invalid" not in w and w["accelerator"] is None for w in workers)
        assert all(w["capacity"] == {"GPU": 2.0} for w in workers)
        with dask.annotate(resources={"GPU": 2}):
            assert c.submit(where, 1, key="plain").result(timeout=30)[0] == 1
        with dask.annotate(resources={"GPU": 1}, accelerator="A100"):
            bad = c.submit(where, 2, key="typed")
        with pytest.raises(Exception, match=r"accelerator A100 \(it has no accelerator\)"):
            bad.result(timeout=30)
        assert _errors(c) == {}


def test_a_jobs_attempts_run_only_where_its_accelerator_is(tmp_path: Path) -> None:
    """``jobs.submit(..., accelerator="V100")``: every part's attempt is placed on the V100
    worker, never on the A100 one."""
    from distributed import LocalCluster

    from daskjobs import jobs
    from daskjobs.jobs import JobsService

    service = JobsService(
        ledger=f"sqlite:///{tmp_path / 'ledger.sqlite'}",
        store=str(tmp_path / "store"),
        lease="5s",
        interval="50ms",
    )
    plugin = JobsPlugin(policy="fifo", resources=RESOURCES)
    with (
        dask.config.set({**VALIDATE, "daskjobs.inventory": INVENTORY}),
        LocalCluster(
            n_workers=2,
            threads_per_worker=4,
            processes=False,
            dashboard_address=":0",
            resources={"GPU": 2},
            scheduler_kwargs={"plugins": [plugin, service]},
        ) as cl,
        Client(cl) as c,
    ):
        _wait_inventories(c, 2)
        job = jobs.submit(
            c,
            "typed",
            kind="inference",
            parts=6,
            target="jobtasks:worker_name",
            resources={"GPU": 1},
            accelerator="V100",
        )
        assert job.result(timeout=60) == ["1"] * 6
        assert _errors(c) == {}


def test_a_job_spec_checks_its_placement_and_keeps_its_identity_without_one() -> None:
    from daskjobs.jobs.model import JobSpec

    plain = JobSpec("same", target="m:f")
    assert not {"accelerator", "gpu_memory", "constraint"} & set(plain.to_json())
    typed = JobSpec("same", target="m:f", accelerator=["A100", "H100"], gpu_memory="40GB")
    assert typed.job_id != plain.job_id
    assert JobSpec.from_json(typed.to_json()) == typed
    assert typed.placement() == {"accelerator": ["A100", "H100"], "gpu_memory": "40GB"}
    with pytest.raises(ValueError, match="unknown name 'colour'"):
        JobSpec("same", target="m:f", constraint="colour == 'red'")
    with pytest.raises(ValueError, match="'lots' is not a size"):
        JobSpec("same", target="m:f", gpu_memory="lots")


def test_nvidia_smi_is_read_where_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake ``nvidia-smi`` on the PATH: two A100s of 80 GB and a smaller third device."""
    from daskjobs.plugin.workers.inventory import nvidia_smi

    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        "echo 'NVIDIA A100-SXM4-80GB, 81920'\n"
        "echo 'NVIDIA A100-SXM4-80GB, 81920'\n"
        "echo 'NVIDIA A100-PCIE-40GB, 40960'\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert nvidia_smi() == {"accelerator": "A100", "gpus": 3, "gpu_memory": 40960 * 2**20}
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert nvidia_smi() is None


def test_a_malformed_inventory_is_named_and_counts_as_no_accelerator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DASKJOBS_INVENTORY", '{"accelerator": "A100", "gpus": "two"}')
    plugin = JobsPlugin(policy="fifo", resources=RESOURCES)
    with _gpu_client(plugin, n_workers=1) as c:
        (w,) = _placer_status(c)["workers"].values()
        assert "gpus: expected a number, got 'two'" in w["invalid"]
        assert w["accelerator"] is None
        monkeypatch.setenv("DASKJOBS_INVENTORY", "{not json")
        c.run(lambda dask_worker: dask_worker.plugins["daskjobs-inventory"].refresh())
        deadline = time.time() + 30
        while "JSONDecodeError" not in next(iter(_placer_status(c)["workers"].values())).get(
            "invalid", ""
        ):
            assert time.time() < deadline
            time.sleep(0.02)
        assert _errors(c) == {}


@pytest.mark.slow
def test_an_interactive_task_preempts_a_best_effort_gang_whole(store: Path) -> None:
    """Preemption and gangs together: a best-effort gang of 4 holds every GPU; an
    interactive one-GPU task arrives. The preemption policy picks a victim; its whole gang
    yields (all 4 members), the interactive task runs, and the gang starts again whole
    from its checkpoints, with an unpreempted run's results."""
    plugin = JobsPlugin(
        policy="fifo",
        resources=RESOURCES,
        preemption={"enabled": True, "min_runtime": 0, "grace": "10s", "interval": "20ms"},
    )
    with _gpu_client(plugin) as c:
        with dask.annotate(resources={"GPU": 1}, gang="bg", gang_size=4):
            fs = [c.submit(member, i, 40, key=f"bg-{i}") for i in range(4)]
        deadline = time.time() + 30
        while not (store / "daskjobs-store-v1" / "checkpoints").exists():
            assert time.time() < deadline, "the gang did not start"
            time.sleep(0.02)
        time.sleep(0.2)
        with dask.annotate(resources={"GPU": 1}, job_class="te"):
            te = c.submit(span, 0.05, key="interactive")
        te_end = te.result(timeout=60)[1]
        results = c.gather(fs)
        st = _placer_status(c)
        pre = status(c)["preemption"]
        assert _errors(c) == {}
    g = st["gangs"]["bg"]
    assert g["starts"] == 2 and g["restarts"] == 1, g
    assert pre["requested"] == 4 and pre["yielded"] == 4, pre
    assert pre["gangs_preempted"] == 1
    assert all(r["step"] == 40 and r["runs"] == 2 for r in results), results
    assert all(r["resumed_at"][-1] > 0 for r in results), results
    assert te_end < min(r["end"] for r in results)


def stubborn(seconds: float) -> float:
    """A best-effort task that never asks whether it is preempted."""
    time.sleep(seconds)
    return time.time()


def _started(dask_scheduler: Any) -> int:
    """Placed tasks whose start the placer knows."""
    placer = dask_scheduler.plugins["daskjobs"].placer
    return sum(t.started is not None for t in placer.holding.values())


def test_an_ignored_request_is_counted_and_audited_as_without_resources() -> None:
    """With resources on the placer enacts preemption through the enactor that runs without
    them: two best-effort tasks that never check hold every GPU; each asked to yield for an
    interactive task keeps its GPUs past the grace, and is counted and audited
    (``preempt-requested``, ``preempt-ignored``) in ``status()["preemption"]``, the schema
    of tests/plugin/test_preemption_live.py's twin; the interactive task waits for a GPU."""
    plugin = JobsPlugin(
        policy="fifo",
        resources=RESOURCES,
        preemption={"enabled": True, "min_runtime": 0, "grace": "200ms", "interval": "20ms"},
    )
    with _gpu_client(plugin) as c:
        with dask.annotate(resources={"GPU": 2}):
            be = [c.submit(stubborn, 1.5, key=f"stubborn-{i}") for i in range(2)]
        until(lambda: c.run_on_scheduler(_started) >= 2, "both best-effort tasks' starts")
        with dask.annotate(resources={"GPU": 1}, job_class="te"):
            te = c.submit(span, 0.0, key="probe-0")
        started = te.result(timeout=60)[0]
        ends = c.gather(be)
        st = status(c)
        events = [e for _, e in c.get_events("daskjobs")]
    assert st["errors"] == {}
    pre = st["preemption"]
    assert started >= min(ends)  # it waited for a GPU to come free
    # each stubborn task was asked once and, past the grace period, counted and left alone
    assert pre["requested"] == 2 and pre["ignored"] == 2 and pre["yielded"] == 0, pre
    # every victim asked is accounted for once
    settled = pre["yielded"] + pre["finished_first"] + pre["ignored"] + pre["lost_with_worker"]
    assert pre["requested"] == settled and pre["asked"] == [], pre
    requested = [e for e in events if e["action"] == "preempt-requested"]
    ignored = [e for e in events if e["action"] == "preempt-ignored"]
    assert [e["key"] for e in requested] == ["probe-0", "probe-0"]
    assert sorted(v for e in ignored for v in e["victims"]) == ["stubborn-0", "stubborn-1"]
    assert all(e["key"] == "probe-0" and e["grace"] == 0.2 for e in ignored)


@pytest.mark.slow
def test_a_victim_whose_worker_leaves_is_counted_as_lost_with_it_not_as_a_yield() -> None:
    """With resources on, as without: a victim asked to yield whose worker leaves before it
    does is counted ``lost_with_worker`` (it did not yield, and its task's preemptions do
    not grow); every victim asked is accounted for once, and every task still runs."""
    plugin = JobsPlugin(
        policy="fifo",
        resources=RESOURCES,
        preemption={"enabled": True, "min_runtime": 0, "grace": "10s", "interval": "20ms"},
    )
    with _gpu_client(plugin) as c:
        with dask.annotate(resources={"GPU": 2}):
            be = [c.submit(stubborn, 3.0, key=f"stubborn-{i}") for i in range(2)]
        until(lambda: c.run_on_scheduler(_started) >= 2, "both best-effort tasks' starts")
        with dask.annotate(resources={"GPU": 1}, job_class="te"):
            te = c.submit(span, 0.0, key="probe-0")
        asked = until(lambda: status(c)["preemption"]["asked"], "a victim asked")
        doomed = c.run_on_scheduler(
            lambda dask_scheduler, key: dask_scheduler.tasks[key].processing_on.address,
            key=asked[0],
        )
        c.sync(c.cluster.scheduler.remove_worker, address=doomed, stimulus_id="test-kill")
        te.result(timeout=60)
        c.gather(be)
        st = status(c)
    assert st["errors"] == {}
    pre = st["preemption"]
    assert pre["lost_with_worker"] == 1 and pre["yielded"] == 0, pre
    assert pre["max_per_task"] == 0, pre
    settled = pre["yielded"] + pre["finished_first"] + pre["ignored"] + pre["lost_with_worker"]
    assert pre["requested"] == settled and pre["asked"] == [], pre
