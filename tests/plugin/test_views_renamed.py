"""The plugin's attempt view answers the deprecated ``books`` as ``policy_state``, with a
``FutureWarning``, for one release."""

from __future__ import annotations

import warnings

import pytest

from daskjobs.plugin.views import LiveAttempt, LiveTask


def test_live_attempt_books_reads_and_writes_policy_state_with_a_warning() -> None:
    a = LiveAttempt(LiveTask("t", 1.0, 1, "a", 0.0, (), "annotation", "s"), 0, 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert a.policy_state is None
        a.policy_state = (1, 2.0)
    with pytest.warns(
        FutureWarning, match=r"attempt.books is deprecated: use attempt.policy_state"
    ):
        assert a.books == (1, 2.0)
    with pytest.warns(FutureWarning, match=r"attempt.books is deprecated"):
        a.books = None
    assert a.policy_state is None
