"""The simulator's attempt answers the deprecated ``books`` as ``policy_state``, with a
``FutureWarning``, for one release."""

from __future__ import annotations

import warnings

import pytest

from daskjobs.sim.model import Attempt, Task


def test_attempt_books_reads_and_writes_policy_state_with_a_warning() -> None:
    a = Attempt(0, Task("t", 1.0, 1.0), 0, (0,), 0.0, False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a.policy_state = (1, 2.0)
        assert a.policy_state == (1, 2.0)
    with pytest.warns(
        FutureWarning, match=r"attempt.books is deprecated: use attempt.policy_state"
    ):
        assert a.books == (1, 2.0)
    with pytest.warns(FutureWarning, match=r"attempt.books is deprecated"):
        a.books = None
    assert a.policy_state is None
