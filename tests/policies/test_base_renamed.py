"""The policy interface's old names (``daskjobs.policies.base.RENAMED``) still work for one
release, each with a ``FutureWarning`` that names its replacement; the new names warn
nothing."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

from daskjobs.policies import Capabilities, FairShare, NodeAware, base


def test_team_books_is_team_accounts_with_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert FairShare.capabilities.team_accounts
        new = base.TeamAccounts
    with pytest.warns(FutureWarning, match=r"TeamBooks is deprecated: use TeamAccounts"):
        assert base.TeamBooks is new
    with pytest.warns(FutureWarning, match=r"team_books is deprecated: use .*team_accounts"):
        assert FairShare.capabilities.team_books is True
    with pytest.warns(FutureWarning, match=r"team_books is deprecated: use .*team_accounts"):
        caps = Capabilities(team_books=True)
    assert caps == Capabilities(team_accounts=True) and caps.team_accounts
    with pytest.raises(AttributeError, match="no attribute 'TeamLedger'"):
        base.TeamLedger  # noqa: B018


def test_attempt_books_in_reads_and_field_is_policy_state_with_a_warning() -> None:
    with pytest.warns(
        FutureWarning, match=r"attempt.books is deprecated: use attempt.policy_state"
    ):
        caps = Capabilities(reads={"attempt.books", "node.waiting"})
    assert caps.reads == {"attempt.policy_state", "node.waiting"}
    assert caps.reads <= NodeAware.capabilities.reads
    view = SimpleNamespace(policy_state=(1, 2.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert base.field(view, "attempt.policy_state") == (1, 2.0)
    with pytest.warns(FutureWarning, match=r"attempt.books is deprecated") as caught:
        assert base.field(view, "attempt.books") == (1, 2.0)
    assert caught[0].filename == __file__  # the warning points at the caller
    with pytest.raises(ValueError, match=r"names no optional view field: attempt.ledger"):
        Capabilities(reads={"attempt.ledger"})
