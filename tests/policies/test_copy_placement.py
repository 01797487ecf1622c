"""Where a backup copy goes (``Speculation.choose``, the rule the plugin, the simulator and
replay share): never on a node the policy believes no faster than a slow primary's."""

from __future__ import annotations

from types import SimpleNamespace

from daskjobs.policies import Speculation
from daskjobs.sim import Task


class _Speeds:
    def __init__(self, speeds: dict[int, float]) -> None:
        self.speeds = speeds

    def speed(self, node: int) -> float:
        return self.speeds[node]


def _node(index: int, free: int = 2, cores: int = 2) -> SimpleNamespace:
    return SimpleNamespace(index=index, free=free, cores=cores, copies=0, same_host=False)


def _attempt(node: int) -> SimpleNamespace:
    return SimpleNamespace(task=Task("t", 1.0), node=node, start=0.0)


def test_a_slow_primary_s_copy_skips_a_free_node_as_slow() -> None:
    spec = Speculation()
    speeds = _Speeds({0: 4.0, 1: 4.0, 2: 1.0})
    # a free node as slow as the primary's (1) is no place for the copy: it cannot end first
    target, why = spec.choose(_attempt(0), [_node(1)], speeds)
    assert target is None and why == "only nodes as slow as the primary's are free"
    # with a busy fast node it may queue on, the copy waits there instead
    fast_busy = _node(2, free=0)
    assert spec.choose(_attempt(0), [_node(1), fast_busy], speeds, may_queue=True)[0] is fast_busy
    # a free fast node takes it
    fast = _node(2)
    assert spec.choose(_attempt(0), [_node(1), fast], speeds) == (fast, "ok")


def test_a_nominal_primary_s_copy_may_go_to_a_free_node_as_fast() -> None:
    """A straggler on a nominal node (stuck, not slow): another nominal node may run its copy."""
    spec = Speculation()
    speeds = _Speeds({0: 1.0, 1: 1.1})
    other = _node(1)
    assert spec.choose(_attempt(0), [other], speeds) == (other, "ok")


def test_a_slow_primary_s_copy_goes_to_a_node_believed_clearly_faster() -> None:
    spec = Speculation()
    speeds = _Speeds({0: 2.0, 1: 1.8, 2: 1.5})
    # 1.8 is within the learner's noise of 2.0; 1.5 is faster by more than it
    slowish, faster = _node(1), _node(2)
    assert spec.choose(_attempt(0), [slowish], speeds)[0] is None
    assert spec.choose(_attempt(0), [slowish, faster], speeds) == (faster, "ok")
