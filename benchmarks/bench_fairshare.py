"""The chapter's two-team case, scaled to a laptop, live on dask: FIFO against fair share.

Team ``a`` submits 400 tasks of 50 ms; team ``b`` submits 40 more 0.5 s later. On one worker
with 8 threads, how long after its submission is team b's median (and last) task done, under
``JobsPlugin(policy="fifo")`` and under ``JobsPlugin(policy="fair-share")`` with equal targets?
The runs alternate (FIFO first in even reps, fair share first in odd ones); the ratio
compares the two runs of each rep. The chapter's published figures for the same case:
0.59 h against 8.28 h for team b's median (a ratio of 0.07).

Where each task's team comes from (``--teams``): ``annotated`` (one client, each team's
graph under ``dask.annotate(team=...)``), ``stated`` (one client per team, each stating its
team once with ``daskjobs.set_team``, nothing annotated) or ``certificate`` (a TLS cluster
with client certificates, made here with ``openssl``, one client per team whose certificate
the plugin maps to it: ``daskjobs.teams.identities``, nothing stated or annotated).

    python benchmarks/bench_fairshare.py [--reps 3] [--teams annotated|stated|certificate]
    python benchmarks/bench_fairshare.py --quick    # one rep
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import harness
from distributed import Client, Security

from daskjobs import JobsPlugin, local_cluster, set_team

#: Where each task's team comes from (module docstring).
TEAMS_FROM = ("annotated", "stated", "certificate")
#: The certificate identity of each team's client, in ``certificate`` runs.
IDENTITIES = {"team-a-user": "a", "team-b-user": "b"}


def job(team: str, i: int, seconds: float) -> tuple[str, int, float, float]:
    t0 = time.time()
    time.sleep(seconds)
    return (team, i, t0, time.time())


class Certificates:
    """A certificate authority and certificates for the cluster's nodes and each team's
    client, made with ``openssl`` in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

        def sh(*args: str) -> None:
            subprocess.run(args, cwd=directory, check=True, capture_output=True)

        key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        ca = ["-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial", "-days", "2"]
        sh(
            "openssl",
            "req",
            "-x509",
            *key,
            "-days",
            "2",
            "-subj",
            "/CN=bench CA",
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca.pem",
        )
        for who in ("node", *IDENTITIES):
            sh(
                "openssl",
                "req",
                *key,
                "-subj",
                f"/CN={who}",
                "-keyout",
                f"{who}-key.pem",
                "-out",
                f"{who}.csr",
            )
            sh("openssl", "x509", "-req", "-in", f"{who}.csr", *ca, "-out", f"{who}.pem")

    def security(self, who: str, *roles: str) -> Security:
        files = {
            f"tls_{role}_{part}": str(self.dir / f"{who}{end}")
            for role in roles
            for part, end in (("cert", ".pem"), ("key", "-key.pem"))
        }
        return Security(tls_ca_file=str(self.dir / "ca.pem"), require_encryption=True, **files)


@contextlib.contextmanager
def clients(cluster: Any, teams_from: str, certs: Certificates | None) -> Iterator[list[Any]]:
    """Team a's client and team b's (the same one when the graphs are annotated)."""
    if teams_from == "annotated":
        with Client(cluster) as client:
            yield [client, client]
        return
    who = list(IDENTITIES)
    sec = [certs.security(w, "client") if certs is not None else None for w in who]
    address = cluster.scheduler_address
    with Client(address, security=sec[0]) as ca, Client(address, security=sec[1]) as cb:
        if teams_from == "stated":
            set_team(ca, "a")
            set_team(cb, "b")
        yield [ca, cb]


def run(plugin: JobsPlugin, teams_from: str, certs: Certificates | None) -> dict[str, float]:
    security = certs.security("node", "scheduler", "worker", "client") if certs else None
    with (
        local_cluster(
            plugin,
            n_workers=1,
            threads_per_worker=8,
            processes=False,
            dashboard_address=":0",
            security=security,
        ) as cluster,
        clients(cluster, teams_from, certs) as (ca, cb),
    ):
        annotated = teams_from == "annotated"
        with dask.annotate(**({"team": "a"} if annotated else {})):
            fa = ca.map(job, ["a"] * 400, range(400), [0.05] * 400, pure=False)
        time.sleep(0.5)
        tb = time.time()
        with dask.annotate(**({"team": "b"} if annotated else {})):
            fb = cb.map(job, ["b"] * 40, range(40), [0.05] * 40, pure=False)
        waits = [end - tb for *_, end in cb.gather(fb)]
        a_end = max(end for *_, end in ca.gather(fa)) - tb
        # the teams the plugin gave them, however they came (annotated, stated, certificate)
        seen = [plugin.tasks[f.key].team for f in (fa[0], fb[0])]
    if seen != ["a", "b"]:
        raise RuntimeError(f"the plugin charged team a's and team b's tasks to {seen}")
    return {"b_median": statistics.median(waits), "b_all": max(waits), "a_end": a_end}


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--reps", type=int, default=None, help="reps (default 3; quick 1)")
    ap.add_argument(
        "--teams",
        choices=TEAMS_FROM,
        default="annotated",
        help="where each task's team comes from (default: annotated)",
    )
    args = ap.parse_args(argv)
    reps = args.reps or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory() as tmp:
        certs = Certificates(Path(tmp)) if args.teams == "certificate" else None
        bound = {"identities": IDENTITIES} if certs is not None else {}
        runs = harness.alternate(
            {
                "fifo": lambda: run(JobsPlugin(policy="fifo", teams=bound), args.teams, certs),
                "fair": lambda: run(
                    JobsPlugin(policy="fair-share", teams={"targets": {"a": 1, "b": 1}, **bound}),
                    args.teams,
                    certs,
                ),
            },
            reps,
            show=lambda name, rep, r: f"rep {rep} {name}: b median {r['b_median']:.2f} s",
        )
    rows = []
    for rep, (fifo, fair) in enumerate(zip(runs["fifo"], runs["fair"], strict=True)):
        rows.append(
            [
                rep,
                f"{fifo['b_median']:.2f}",
                f"{fair['b_median']:.2f}",
                f"{fair['b_median'] / fifo['b_median']:.3f}",
                f"{fifo['b_all']:.2f}",
                f"{fair['b_all']:.2f}",
                f"{fifo['a_end']:.2f}",
                f"{fair['a_end']:.2f}",
            ]
        )
    ratios = harness.paired_ratios(
        [r["b_median"] for r in runs["fair"]], [r["b_median"] for r in runs["fifo"]]
    )
    title = f"Fair share, two teams, live (laptop scale; teams {args.teams})"
    report = harness.Report(title, __file__, argv)
    report.section(
        None,
        harness.table(
            [
                "rep",
                "FIFO b median s",
                "fair b median s",
                "ratio",
                "FIFO b all s",
                "fair b all s",
                "FIFO a end s",
                "fair a end s",
            ],
            rows,
        )
        + "\n\nTeam b's median wait, fair share over FIFO (paired by rep): "
        + harness.spread(ratios).text()
        + "; the chapter's published ratio: 0.07.",
    )
    report.chart(
        harness.Chart(
            "Team b's wait after its submission",
            "seconds (median of the reps)",
            ["b median", "b last", "a last"],
            {
                label: [
                    statistics.median(r[k] for r in runs[name])
                    for k in ("b_median", "b_all", "a_end")
                ]
                for name, label in (("fifo", "FIFO"), ("fair", "fair share"))
            },
        )
    )
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
