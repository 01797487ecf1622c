"""What a plain task's own call says (daskjobs/plugin/features.py): its stage is its function,
its parameters its literal arguments, within a fixed budget, and never an error."""

from __future__ import annotations

import enum
import functools
import operator

import numpy as np
import pytest
from dask._task_spec import TaskRef

from daskjobs.plugin.features import MAX_ARGS, MAX_FEATURES, MAX_TEXT, read_call


def backtest(n, window=3, name="x", data=None):
    return n


class Model:
    def __call__(self, n, k=2):
        return n

    def score(self, n):
        return n


class Colour(enum.Enum):
    RED = 1


def test_the_stage_is_the_function_and_parameters_are_named_as_the_function_names_them():
    c = read_call(backtest, (10,), {"window": 7})
    assert c.stage == "test_features.backtest"
    assert c.params == {"n": 10, "window": 7}
    assert c.grows == {"n", "window"}
    # the same call as keywords, or through a partial: the same parameters
    assert read_call(backtest, (), {"n": 10, "window": 7}).params == c.params
    part = read_call(functools.partial(backtest, window=7), (10,), None)
    assert part.stage == c.stage and part.params == c.params
    # a bound method and a callable instance skip self; a class names a callable instance
    assert read_call(Model().score, (4,), {}).params == {"n": 4}
    assert read_call(Model().score, (4,), {}).stage == "test_features.Model.score"
    inst = read_call(Model(), (4,), {"k": 9})
    assert inst.stage == "test_features.Model" and inst.params == {"n": 4, "k": 9}
    # past the names a function has, positions: arg<i>
    assert read_call(backtest, (1, 2, "a", None, 5), {}).params == {
        "n": 1,
        "window": 2,
        "name": "a",
        "arg4": 5,
    }


def test_each_lambda_is_a_stage_of_its_own():
    def f(n):
        return n

    a = read_call(lambda n: n, (1,), {})
    b = read_call(lambda n: n + 1, (1,), {})
    assert a.stage is not None and "<lambda>:" in a.stage
    assert a.stage != b.stage
    assert read_call(f, (1,), {}).stage.endswith("<locals>.f")


@pytest.mark.parametrize("func", [np.sum, operator.add, sum, dict, functools.reduce, max])
def test_dask_and_library_functions_keep_the_key_prefix_and_carry_nothing(func):
    c = read_call(func, (1, 2), {})
    assert c.stage is None and c.params is None and not c.grows


def test_values_numbers_categories_lengths_and_sizes():
    big = list(range(10**6))
    c = read_call(
        backtest,
        (np.int64(5), 2.5, "abc", np.zeros((3, 4))),
        {"flag": True, "colour": Colour.RED, "xs": big, "frame": {"a": 1}},
    )
    assert c.params == {
        "n": 5,
        "window": 2.5,
        "name": "abc",
        "size(data)": 12,
        "flag": True,
        "colour": "Colour.RED",
        "len(xs)": 10**6,
        "len(frame)": 1,
    }
    assert type(c.params["n"]) is int  # a numpy scalar read as a Python number
    # sizes and integer counts are size-like; a float, a string, a bool are not
    assert c.grows == {"n", "size(data)", "len(xs)", "len(frame)"}


def test_what_says_nothing_is_left_out():
    c = read_call(
        backtest,
        (float("nan"), None, "x" * (MAX_TEXT + 1), object()),
        {"ref": TaskRef("other"), "inf": float("inf"), "ok": 1},
    )
    assert c.params == {"ok": 1}  # a reference to another task's output is never read


def test_seeds_and_indexes_are_parameters_but_not_sizes():
    c = read_call(backtest, (), {"seed": 7, "random_state": 3, "i": 2, "n_seeds": 4, "steps": 9})
    assert c.params == {"seed": 7, "random_state": 3, "i": 2, "n_seeds": 4, "steps": 9}
    assert c.grows == {"steps"}


def test_the_budget_holds_however_the_task_was_called():
    def many(*args, **kwargs):
        return args

    c = read_call(many, tuple(range(1, 1000)), {f"k{i}": i for i in range(1000)})
    assert len(c.params) == MAX_FEATURES
    # at most MAX_ARGS arguments are looked at: past that, nothing more is read even if
    # the first ones said nothing
    c = read_call(many, (None,) * MAX_ARGS + (5,), {})
    assert c.params is None


def test_an_argument_that_raises_when_read_is_left_out():
    class Hostile:
        @property
        def shape(self):
            raise RuntimeError("boom")

    class Shaped:
        shape = (2, "x")

    c = read_call(backtest, (Hostile(), Shaped()), {"ok": 3})
    assert c.stage == "test_features.backtest"
    assert c.params is None or "n" not in c.params
