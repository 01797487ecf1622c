"""Schedules pinned bit for bit: every policy, with and without backups.

The simulator's speed work (docs/benchmarks.md, "Simulator throughput") changes how
the engine and the policies keep their state, never what they decide. These digests
were recorded with the code before that work: a 1,200-task sweep of two core sizes
and two teams, some tasks not copyable, the 10 longest submitted last, on 6 nodes x 8
cores with node 0 four times slow and 2% of attempts failing. Durations and
estimates are exact binary fractions of whole numbers (no libm, no numpy draws), so
the digests do not depend on the platform's math library; failures come from numpy's
PCG64 stream, which is the same everywhere.

Each digest is (makespan as float hex, events, backups launched, a hash of every
attempt's task, node, cores, start, end, outcome and backup flag).
"""

from __future__ import annotations

import hashlib

import pytest

from daskjobs.policies import FairShare, Speculation, make_policy
from daskjobs.sim import Cluster, Task, simulate

POLICIES = ("fifo", "lpt", "critical-path", "work-stealing", "fair-share", "node-aware")
SPECS = {
    "none": None,
    "always": Speculation(ahead="always"),
    "horizon": Speculation(ahead="past-horizon"),
}

GOLDEN = {
    ("fifo", "none"): ("0x1.0a7c000000000p+18", 1231, 0, "9a3652bce4cb9487"),
    ("fifo", "always"): ("0x1.e4243c8daa7bcp+17", 1356, 61, "79d4ba608ed55874"),
    ("fifo", "horizon"): ("0x1.e744000000000p+17", 1292, 5, "a29c081ef7c9fafb"),
    ("lpt", "none"): ("0x1.3560000000000p+19", 1231, 0, "fdc3227c245303a2"),
    ("lpt", "always"): ("0x1.1076000000000p+19", 1243, 6, "6b9cb34b9872baff"),
    ("lpt", "horizon"): ("0x1.1076000000000p+19", 1243, 6, "6b9cb34b9872baff"),
    ("critical-path", "none"): ("0x1.3560000000000p+19", 1231, 0, "fdc3227c245303a2"),
    ("critical-path", "always"): ("0x1.1076000000000p+19", 1243, 6, "6b9cb34b9872baff"),
    ("critical-path", "horizon"): ("0x1.1076000000000p+19", 1243, 6, "6b9cb34b9872baff"),
    ("work-stealing", "none"): ("0x1.eebed0b707da6p+17", 1231, 0, "ec2b3aec715428e2"),
    ("work-stealing", "always"): ("0x1.ca9d000000000p+17", 1374, 71, "deaad21de217497d"),
    ("work-stealing", "horizon"): ("0x1.c110000000000p+17", 1360, 59, "85961083529c474c"),
    ("fair-share", "none"): ("0x1.e70288c43a766p+17", 1231, 0, "827eee13c8802ed8"),
    ("fair-share", "always"): ("0x1.e852000000000p+18", 1367, 68, "585830b60c112aae"),
    ("fair-share", "horizon"): ("0x1.e70288c43a766p+17", 1301, 7, "941c3a68f7fb6f27"),
    ("node-aware", "none"): ("0x1.357e000000000p+17", 1231, 0, "cf32d9e27d3ff1e4"),
    ("node-aware", "always"): ("0x1.357e000000000p+17", 1241, 2, "5254e2690f3b9ce4"),
    ("node-aware", "horizon"): ("0x1.357e000000000p+17", 1239, 0, "cf32d9e27d3ff1e4"),
}


def _tasks() -> list[Task]:
    out = []
    for i in range(1200):
        d = 60.0 * (1 + (i * 7919) % 97)
        if i >= 1190:
            d *= 30.0
        e = d * (1 + ((i * 31) % 11 - 5) / 20)
        out.append(
            Task(
                f"t{i}",
                d,
                e,
                cores=1 + (i % 13 == 0),
                team="ab"[i % 2],
                speculate=i % 17 != 0,
            )
        )
    return out


@pytest.mark.parametrize("spec", list(SPECS))
@pytest.mark.parametrize("policy", POLICIES)
def test_schedule_is_pinned(policy: str, spec: str) -> None:
    cluster = Cluster(6, 8, slow={0: 4.0}, failure_rate=0.02)
    p = FairShare({"a": 1.0, "b": 2.0}) if policy == "fair-share" else make_policy(policy)
    s = simulate(_tasks(), cluster, p, spec=SPECS[spec], seed=5)
    h = hashlib.sha256()
    for a in s.attempts:
        h.update(repr((a.task.tid, a.node, a.cores, a.start, a.end, a.outcome, a.backup)).encode())
    got = (s.makespan.hex(), s.events, s.backups_launched, h.hexdigest()[:16])
    assert got == GOLDEN[policy, spec]
