"""Teams from identity on real ``dask scheduler`` / ``dask worker`` processes.

A TLS cluster with client certificates required, certificates made here (tests/helpers/certs.py),
the operator's map in the scheduler's dask config: each client is charged to its certificate's team
without annotating anything; a graph naming another team is refused whole, naming the identity
and both teams, and nothing of it runs; an admin acts for a team and the audit trail says so;
a client without a certificate cannot connect. And on a cluster without TLS, a client states its
team once (dask config and the client preload, as a notebook's environment would) and gets it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import dask
import pytest
import realtasks
from certs import Authority, Issued
from distributed import Security

import daskjobs
from daskjobs import jobs
from daskjobs.plugin import TeamRefused
from daskjobs.plugin.client import explain, status

pytestmark = pytest.mark.realcluster

IDENTITIES = {"alice": "quant", "bob@example.com": "ml"}


def tls_config(ca: Authority, node: Issued, **daskjobs: Any) -> dict[str, Any]:
    """dask's own TLS keys for every process of the cluster (the node certificate for the
    scheduler, the workers and their own clients), and the ``daskjobs`` section."""
    pair = {"cert": node.cert, "key": node.key}
    return {
        "distributed": {
            "comm": {
                "require-encryption": True,
                "tls": {"ca-file": ca.ca_file, "scheduler": pair, "worker": pair, "client": pair},
            }
        },
        "daskjobs": daskjobs,
    }


def security(ca: Authority, who: Issued) -> Security:
    return Security(
        tls_ca_file=ca.ca_file,
        tls_client_cert=who.cert,
        tls_client_key=who.key,
        require_encryption=True,
    )


def events(client: Any, action: str) -> list[dict[str, Any]]:
    return [msg for _, msg in client.get_events("daskjobs") if msg.get("action") == action]


def wait_for(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def test_a_tls_cluster_charges_each_client_to_its_certificates_team(
    real_cluster: Any, tmp_path: Path
) -> None:
    ca = Authority(tmp_path / "certs")
    node = ca.issue("dask-node")
    alice = ca.issue("alice")
    bob = ca.issue("bob", emails=("bob@example.com",))  # mapped by its alternative name
    ops = ca.issue("ops")
    config = tls_config(
        ca,
        node,
        policy="fair-share",
        teams={
            "targets": {"quant": 3, "ml": 1},
            "identities": IDENTITIES,
            # the nodes' own clients (worker_client) act for the team of the task they run
            "admins": ["ops", "dask-node"],
        },
        jobs={"enabled": True},
        ledger={"url": f"sqlite:///{tmp_path / 'ledger.sqlite'}"},
        store=str(tmp_path / "store"),
    )
    rc = real_cluster(n_workers=2, nthreads=2, config=config, security=security(ca, ops))
    assert rc.address.startswith("tls://")
    marks = tmp_path / "marks"
    marks.mkdir()

    with (
        rc.client(security=security(ca, alice)) as a,
        rc.client(security=security(ca, bob)) as b,
        rc.client(security=security(ca, ops)) as admin,
    ):
        # two clients, two certificates, nothing annotated: each its certificate's team
        fa = a.map(realtasks.work, [1, 2, 3], unit=0.0, key=["a-1", "a-2", "a-3"])
        fb = b.map(realtasks.work, [1, 2], unit=0.0, key=["b-1", "b-2"])
        a.gather(fa)
        b.gather(fb)
        assert {explain(a, k)["team"] for k in ("a-1", "a-2", "a-3")} == {"quant"}
        assert {explain(b, k)["team"] for k in ("b-1", "b-2")} == {"ml"}
        # a graph a task submits keeps that task's team (the node certificate is an admin's)
        assert a.submit(realtasks.submits, 2, "a-inner", key="a-outer").result()[1] == 2
        wait_for(lambda: events(admin, "acted-for"), "the worker's act in the audit trail")
        (inner,) = events(admin, "acted-for")
        assert inner["identity"] == "dask-node" and inner["teams"] == {"quant": 1}
        # what it states changes nothing, and stating another team is refused
        assert daskjobs.set_team(a, "quant")["source"] == "certificate"
        with pytest.raises(TeamRefused, match=r"certificate identity 'alice'.*'quant'"):
            daskjobs.set_team(a, "ml")
        st = status(admin)
        rows = {r["team"]: r for r in st["teams"]}
        assert list(rows["quant"]["identities"]) == ["alice"]
        assert list(rows["ml"]["identities"]) == ["bob@example.com"]
        assert rows["quant"]["share"] == pytest.approx(0.75)
        clients = {r["client"]: r for r in st["identities"]["clients"]}
        assert clients[a.id]["identity"] == "alice" and clients[a.id]["team"] == "quant"
        assert clients[b.id]["source"] == "certificate"

        # a graph naming another team: refused whole, with the message, nothing of it runs
        with dask.annotate(team="ml"):
            theirs = dask.delayed(realtasks.mark)(str(marks / "theirs"), dask_key_name="a-ml")
        plain = dask.delayed(realtasks.mark)(str(marks / "plain"), dask_key_name="a-plain")
        after = dask.delayed(realtasks.mark)(str(marks / "after"), theirs, dask_key_name="a-after")
        refused_graph = a.compute([theirs, plain, after])
        for future in refused_graph:
            with pytest.raises(TeamRefused) as refused:
                future.result(timeout=60)
        message = str(refused.value)
        for part in ("certificate identity 'alice'", "team is 'quant'", "names team 'ml'"):
            assert part in message, message
        # her own team's graph runs meanwhile
        assert a.submit(realtasks.mark, str(marks / "own"), key="a-own").result(timeout=60)
        assert sorted(p.name for p in marks.iterdir()) == ["own"]
        statement, graph = events(admin, "refused-team")  # the set_team above, this graph
        assert graph["identity"] == "alice" and graph["named"] == "ml"
        assert "this graph" in graph["error"] and "team 'ml'" in statement["error"]

        # a job that names no team is its submitter's; the ledger records who submitted it
        job = jobs.submit(a, "scored", kind="inference", parts=2, target="jobtasks:score")
        assert job.result(timeout=120) == [0, 10]
        assert job.status()["spec"]["team"] == "quant"
        assert any(h["reason"] == "submitted by alice" for h in job.history())
        with pytest.raises(TeamRefused, match=r"job 'theirs' .*'alice'.*names team 'ml'"):
            jobs.submit(a, "theirs", team="ml", target="jobtasks:score")

        # an admin acts for a team: it runs, and the audit trail says so
        with dask.annotate(team="ml"):
            acted = admin.submit(realtasks.work, 1, 0.0, key="ops-for-ml")
        acted.result(timeout=60)
        assert explain(admin, "ops-for-ml")["team"] == "ml"
        wait_for(
            lambda: any(e["identity"] == "ops" for e in events(admin, "acted-for")),
            "the admin's act in the audit trail",
        )
        act = next(e for e in events(admin, "acted-for") if e["identity"] == "ops")
        assert act["teams"] == {"ml": 1} and act["what"] == "graph"

    # a client without a certificate, or with another authority's, cannot connect (tried in a
    # process of its own: a dask Client that fails to connect leaves its event loop running)
    other = Authority(tmp_path / "other", name="other")
    stranger = other.issue("alice")  # the right name, the wrong authority
    probe = tmp_path / "probe.py"
    probe.write_text(textwrap.dedent(PROBE))
    env = {k: v for k, v in rc.env.items() if k != "DASK_CONFIG"}  # not the nodes' certificate
    out = subprocess.run(
        [sys.executable, str(probe), rc.address, ca.ca_file, stranger.cert, stranger.key],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    tried = json.loads(out.stdout.strip().splitlines()[-1])
    assert "ssl_context" in tried["dask client, no certificate"]  # dask will not even try
    # the others fail in the handshake (the client's side of it says so in several ways)
    assert "Error" in tried["TLS, no certificate"]
    assert "Error" in tried["another authority's certificate"]
    log = rc.log("scheduler")
    assert "peer did not return a certificate" in log and "certificate verify failed" in log
    rc.close()
    assert rc.problems() == []


PROBE = """
import asyncio, json, ssl, sys
from distributed import Client, Security
from distributed.comm import connect

address, ca, cert, key = sys.argv[1:5]
tried = {}

def attempt(what, fn):
    try:
        fn()
        tried[what] = "connected"
    except Exception as e:
        tried[what] = f"{type(e).__name__}: {e}"

async def bare():
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = False  # as dask's own contexts: a cluster's own authority
    comm = await connect(address, timeout=10, ssl_context=ctx)
    await comm.write({"op": "identity"})
    await comm.read()

attempt("dask client, no certificate", lambda: Client(
    address, security=Security(tls_ca_file=ca, require_encryption=True), timeout=10))
attempt("TLS, no certificate", lambda: asyncio.run(bare()))
attempt("another authority's certificate", lambda: Client(address, security=Security(
    tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, require_encryption=True),
    timeout=10))
print(json.dumps(tried))
"""


PLAIN_CLIENT = """
import json, sys
from distributed import Client
import daskjobs, realtasks

with Client(sys.argv[1], timeout=30) as c:
    futs = c.map(realtasks.work, [1, 2], unit=0.0, key=["plain-1", "plain-2"])
    c.gather(futs)
    print(json.dumps({
        "teams": sorted({daskjobs.explain(c, f.key)["team"] for f in futs}),
        "client": c.id,
    }))
"""


def test_without_tls_a_client_states_its_team_once_and_gets_it(
    real_cluster: Any, tmp_path: Path
) -> None:
    """A notebook's environment names the team and the client preload: plain dask code in a
    new process, no daskjobs call, no annotation, is that team's."""
    rc = real_cluster(n_workers=1, nthreads=2, config={"daskjobs": {"policy": "fair-share"}})
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(PLAIN_CLIENT))
    env = dict(rc.env)
    env["DASK_DASKJOBS__TEAM"] = "quant"
    env["DASK_DISTRIBUTED__CLIENT__PRELOAD"] = '["daskjobs.client_preload"]'
    out = subprocess.run(
        [sys.executable, str(script), rc.address],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["teams"] == ["quant"]
    # a client of this process stated nothing: the default; set_team once changes that
    with rc.client() as c:
        assert c.submit(realtasks.work, 1, 0.0, key="unstated").result()[1] == 1
        assert explain(c, "unstated")["team"] == "default"
        assert daskjobs.set_team(c, "ml") == {
            "client": c.id,
            "team": "ml",
            "identity": None,
            "admin": False,
            "source": "stated",
        }
        assert c.submit(realtasks.work, 1, 0.0, key="stated").result()[1] == 1
        assert explain(c, "stated")["team"] == "ml"
        booked = {r["team"]: r["booked"] for r in status(c)["teams"]}
        assert set(booked) >= {"quant", "ml", "default"}
    rc.close()
    assert rc.problems() == []
    assert os.environ.get("DASK_DASKJOBS__TEAM") is None  # the test's own process untouched
