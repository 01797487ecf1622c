"""``status()["speculation"]``'s counts of losers' threads, under their plain names and, for
one release, the deprecated ones (:data:`daskjobs.plugin.enact.speculation.DEPRECATED_STATS`)."""

from __future__ import annotations

from daskjobs.plugin.audit import Audit
from daskjobs.plugin.enact.speculation import DEPRECATED_STATS, Speculator
from daskjobs.plugin.speeds import WorkerSpeeds
from daskjobs.policies import Speculation


def test_the_losers_counts_under_the_plain_keys_and_the_deprecated_ones_alike() -> None:
    audit = Audit(10)
    sp = Speculator(Speculation(), audit, {}, WorkerSpeeds(audit))
    sp.running_losers = {"tcp://a:1": {"x", "y"}, "tcp://b:1": {"z"}}
    sp.moved, sp.reclaimed = 4, 1
    st = sp.stats()
    assert (st["running_losers"], st["moved_off_losers"], st["losers_reclaimed"]) == (3, 4, 1)
    assert (st["zombies"], st["moved_off_zombies"], st["zombies_reclaimed"]) == (3, 4, 1)
    assert {old: st[old] for old in DEPRECATED_STATS} == {
        old: st[new] for old, new in DEPRECATED_STATS.items()
    }
