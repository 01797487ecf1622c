"""A client's team (daskjobs/plugin/identity.py): stated once, or its certificate's.

Pure tests of :class:`ClientTeams` on stand-in tasks (which team, which graph is refused and
with what message, what the audit trail says), then a cluster in this process where one client
states its team once and every entry point of dask and daskjobs charges its graphs to it.
The same with TLS and certificates on real processes: tests/real/test_real_identity.py.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dask
import pytest
from conftest import VALIDATE
from distributed import Client, LocalCluster, worker_client
from distributed.diagnostics.plugin import SchedulerPlugin

import daskjobs
from daskjobs import jobs
from daskjobs.config import TeamSettings, client_team, settings
from daskjobs.jobs.service import JobsService
from daskjobs.plugin import JobsPlugin, TeamRefused, identity
from daskjobs.plugin.audit import Audit
from daskjobs.plugin.identity import ClientTeams


def teams(**kw: Any) -> ClientTeams:
    return ClientTeams(TeamSettings(**kw), Audit(100))


def task(key: str, team: str | None = None) -> Any:
    return SimpleNamespace(key=key, annotations={"team": team} if team else {})


def events(ct: ClientTeams, action: str) -> list[dict[str, Any]]:
    return [e for e in ct.audit.events if e["action"] == action]


BOUND = {
    "identities": {"alice": "quant", "bob@example.com": "ml"},
    "admins": ("ops",),
    "targets": {"quant": 1, "ml": 1},
}


# -- the trusted model: what a client states ---------------------------------------------------


def test_a_stated_team_is_the_team_of_every_unannotated_task_and_annotations_stand() -> None:
    ct = teams()
    assert ct.graph_team("c1", [task("a")]) == "default"
    ct.state("c1", "quant", None)
    assert ct.graph_team("c1", [task("a"), task("b", team="ml")]) == "quant"
    assert ct.graph_team("c2", [task("a")]) == "default"  # another client stated nothing
    assert ct.describe("c1") == {
        "client": "c1",
        "team": "quant",
        "identity": None,
        "admin": False,
        "source": "stated",
    }
    ct.state("c1", None, None)  # a statement taken back
    assert ct.graph_team("c1", [task("a")]) == "default"
    assert not events(ct, "refused-team") and not events(ct, "acted-for")


def test_a_graph_a_task_submitted_keeps_that_tasks_team() -> None:
    ct = teams()
    assert ct.graph_team("worker-client", [task("inner")], inherited="quant") == "quant"
    ct.state("worker-client", "ml", None)  # a statement wins over the inherited team
    assert ct.graph_team("worker-client", [task("inner")], inherited="quant") == "ml"


# -- teams bound to certificates ------------------------------------------------------------------


def test_a_certificates_names_map_to_its_team_and_admins_are_named() -> None:
    ct = teams(**BOUND)
    assert ct.whose(("alice", "alice@example.com")) == ("alice", "quant", False)
    assert ct.whose(("Bob", "bob@example.com")) == ("bob@example.com", "ml", False)  # a SAN
    assert ct.whose(("ops",)) == ("ops", None, True)
    assert ct.whose(("carol",)) == ("carol", None, False)
    assert ct.whose(None) == (None, None, False)


def test_a_bound_client_gets_its_certificates_team_whatever_it_states() -> None:
    ct = teams(**BOUND)
    assert ct.connected("c1", ("alice",))
    assert ct.graph_team("c1", [task("a"), task("b", team="quant")]) == "quant"
    with pytest.raises(TeamRefused) as e:
        ct.state("c1", "ml", ("alice",))
    assert "certificate identity 'alice'" in str(e.value) and "'quant'" in str(e.value)
    ct.state("c1", "quant", ("alice",))  # its own team: fine
    assert ct.describe("c1")["source"] == "certificate"


def test_a_graph_naming_another_team_is_refused_naming_identity_and_both_teams() -> None:
    ct = teams(**BOUND)
    ct.connected("c1", ("alice",))
    graph = [task("ok", team="quant"), task("theirs-1", team="ml"), task("plain")]
    with pytest.raises(TeamRefused) as e:
        ct.graph_team("c1", graph)
    message = str(e.value)
    for part in ("client c1", "certificate identity 'alice'", "team is 'quant'", "'theirs-1'"):
        assert part in message
    assert "names team 'ml'" in message and "nothing of the graph runs" in message
    (refused,) = events(ct, "refused-team")
    assert refused["identity"] == "alice" and refused["team"] == "quant"
    assert refused["named"] == "ml" and ct.refused == 1


def test_an_admin_acts_for_any_team_and_the_audit_trail_says_so() -> None:
    ct = teams(**BOUND)
    ct.connected("op", ("ops",))
    graph = [task("q1", team="quant"), task("q2", team="quant"), task("m", team="ml")]
    assert ct.graph_team("op", graph) == "default"  # its own: unmapped admin
    (acted,) = events(ct, "acted-for")
    assert acted["identity"] == "ops" and acted["what"] == "graph"
    assert acted["teams"] == {"ml": 1, "quant": 2}
    ct.state("op", "ml", ("ops",))  # a statement for another team: an act too
    assert ct.graph_team("op", [task("x"), task("y")]) == "ml"
    assert [e["what"] for e in events(ct, "acted-for")] == ["graph", "statement", "graph"]
    assert events(ct, "acted-for")[-1]["teams"] == {"ml": 2}
    # a graph a task of quant submitted keeps quant (the workers' identity is an admin)
    ct.state("op", None, ("ops",))
    assert ct.graph_team("op", [task("inner")], inherited="quant") == "quant"
    assert ct.acted_for == 4


def test_a_non_admin_does_not_inherit_a_submitting_tasks_team() -> None:
    ct = teams(**BOUND)
    ct.connected("c1", ("alice",))
    assert ct.graph_team("c1", [task("inner")], inherited="ml") == "quant"


@pytest.mark.parametrize("unmapped", ["default", "refuse"])
def test_an_unmapped_certificate_or_none_gets_the_default_or_is_refused(unmapped: str) -> None:
    ct = teams(**BOUND, unmapped=unmapped)
    ct.connected("carol", ("carol",))
    ct.connected("plain", None)
    for client, who in (("carol", "'carol'"), ("plain", "no certificate")):
        if unmapped == "default":
            assert ct.graph_team(client, [task("a")]) == "default"
            with pytest.raises(TeamRefused):  # the default is its team: others are refused
                ct.graph_team(client, [task("a", team="quant")])
        else:
            with pytest.raises(TeamRefused, match="maps to no team") as e:
                ct.graph_team(client, [task("a")])
            assert who in str(e.value)
            assert ct.describe(client)["team"] is None
            assert ct.describe(client)["source"] == "refused"


def test_a_client_id_connected_with_another_certificate_is_refused() -> None:
    ct = teams(**BOUND)
    assert ct.connected("c1", ("alice",))
    assert not ct.connected("c1", ("bob@example.com",))
    assert ct.graph_team("c1", [task("a")]) == "quant"  # still alice's
    (e,) = events(ct, "refused-client")
    assert e["identity"] == "bob@example.com" and "'alice'" in e["reason"]
    assert ct.connected("c1", ("alice",))  # the same certificate again: a reconnection


def test_a_statement_from_another_identity_than_the_clients_is_refused() -> None:
    ct = teams(**BOUND)
    ct.connected("c1", ("alice",))
    with pytest.raises(TeamRefused, match="team statement for client c1"):
        ct.state("c1", "quant", ("bob@example.com",))


def test_a_job_names_its_team_or_takes_its_submitters_and_the_connection_decides() -> None:
    ct = teams(**BOUND)
    ct.connected("c1", ("alice",))
    assert ct.job_team("c1", ("alice",), None, "j") == "quant"
    assert ct.job_team("c1", ("alice",), "quant", "j") == "quant"
    with pytest.raises(TeamRefused, match=r"job 'j' .*'alice'.*names team 'ml'"):
        ct.job_team("c1", ("alice",), "ml", "j")
    # the request's own certificate decides, whichever client id it gives
    with pytest.raises(TeamRefused):
        ct.job_team("c1", ("bob@example.com",), "quant", "j")
    assert ct.job_team(None, ("ops",), "ml", "j") == "ml"
    assert events(ct, "acted-for")[-1]["what"] == "job"
    trusted = teams()
    trusted.state("c1", "ml", None)
    assert trusted.job_team("c1", None, None, "j") == "ml"
    assert trusted.job_team("c1", None, "quant", "j") == "quant"


def test_the_schedulers_own_clients_are_trusted() -> None:
    ct = teams(**BOUND)
    ct.connected("service", ("scheduler",))  # unmapped
    ct.trust("service")
    assert ct.graph_team("service", [task("a", team="ml"), task("b", team="quant")]) == "default"
    assert not events(ct, "refused-team") and not events(ct, "acted-for")


# -- settings ------------------------------------------------------------------------------------


def test_the_clients_team_is_read_from_its_config() -> None:
    assert client_team() is None
    with dask.config.set({"daskjobs.team": "quant"}):
        assert client_team() == "quant"
        assert client_team("ml") == "ml"
    with dask.config.set({"daskjobs.team": 3}), pytest.raises(ValueError, match=r"daskjobs\.team"):
        client_team()


def test_a_clients_plugin_takes_the_bound_teams_from_the_schedulers_config() -> None:
    from daskjobs.plugin.trust import apply_trust

    mine = JobsPlugin(teams={"admins": ["me"], "unmapped": "refuse"})
    mine.from_client = True
    with dask.config.set({"daskjobs.teams.identities": {"alice": "quant"}}):
        s = apply_trust(mine, SimpleNamespace(plugins={}), JobsPlugin)
    assert s.teams.admins == () and s.teams.unmapped == "default"
    assert dict(s.teams.identities) == {"alice": "quant"}


def test_bound_teams_must_be_configured_teams_when_teams_are_strict() -> None:
    with pytest.raises(ValueError, match=r"teams.identities.alice: expected a team listed"):
        settings(teams={"strict": True, "targets": {"ml": 1}, "identities": {"alice": "quant"}})


# -- one client, every entry point -----------------------------------------------------------------


class TeamsSeen(SchedulerPlugin):
    """Notes the team the daskjobs plugin gave each task of each graph, as graphs arrive."""

    name = "teams-seen"

    def __init__(self, jobs_plugin: JobsPlugin) -> None:
        self.jobs_plugin = jobs_plugin
        self.seen: dict[Any, str] = {}

    def update_graph(self, scheduler: Any, *, tasks: Any = (), **kwargs: Any) -> None:
        for key in tasks:
            v = self.jobs_plugin.tasks.get(key)
            if v is not None:
                self.seen[key] = v.team


def _name(key: Any) -> Any:
    return key[0] if isinstance(key, tuple) else key


def inc(x: int) -> int:
    return x + 1


def submits_inner(x: int) -> int:
    with worker_client() as c:
        return int(c.submit(inc, x, key=f"inner-{x}").result())


def teams_of(seen: TeamsSeen, prefix: str) -> set[str]:
    found = {t for k, t in seen.seen.items() if str(_name(k)).startswith(prefix)}
    assert found, f"no task {prefix}* was ranked"
    return found


def test_a_client_states_its_team_once_and_every_entry_point_charges_it(tmp_path: Path) -> None:
    import dask.array as da
    import joblib

    from daskjobs.examples import build_sweep

    plugin = JobsPlugin(policy="fair-share", teams={"targets": {"quant": 2, "ml": 1}})
    seen = TeamsSeen(plugin)
    service = JobsService(
        ledger=f"sqlite:///{tmp_path / 'ledger.sqlite'}", store=str(tmp_path / "store")
    )
    with (
        dask.config.set(VALIDATE),
        LocalCluster(
            n_workers=1,
            threads_per_worker=3,
            processes=False,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [plugin, seen, service]},
        ) as lc,
        Client(lc) as other,
        Client(lc) as c,
    ):
        with dask.config.set({"daskjobs.team": "quant"}):
            answer = daskjobs.set_team(c)
        assert answer["team"] == "quant" and answer["source"] == "stated"
        # dask's own entry points, not a team annotation among them
        assert c.compute(dask.delayed(inc)(1, dask_key_name="compute-1")).result() == 2
        arr = c.persist(da.ones(4, chunks=2, name="persist-arr"))
        assert int(arr.sum().compute()) == 4
        assert c.submit(inc, 1, key="submit-1").result() == 2
        assert c.gather(c.map(inc, [1, 2], key=["map-1", "map-2"])) == [2, 3]
        assert c.submit(submits_inner, 5, key="outer-5").result() == 6
        with joblib.parallel_backend("dask", client=c):
            out = joblib.Parallel(n_jobs=2)(joblib.delayed(inc)(i) for i in range(4))
        assert out == [1, 2, 3, 4]
        # daskjobs' own: a sweep and a job that name no team
        sweep = build_sweep(1, 200, fast=[5], slow=[20], costs=[0.0], name="teamed")
        assert sweep.run(c, store=str(tmp_path / "sweeps"), progress=False).failures == ()
        job = jobs.submit(c, "scored", kind="inference", parts=2, target="jobtasks:score")
        assert job.result(timeout=60) == [0, 10]
        assert job.status()["spec"]["team"] == "quant"
        # another client, which stated nothing: the default team
        assert other.submit(inc, 1, key="unstated-1").result() == 2

        for prefix in ("compute-", "persist-arr", "submit-", "map-", "outer-", "inner-"):
            assert teams_of(seen, prefix) == {"quant"}, prefix
        assert teams_of(seen, "batch_of_inc") == {"quant"}  # joblib's batches
        for stage in ("synthetic_prices", "rolling_features", "crossover_backtest"):
            assert teams_of(seen, stage) == {"quant"}, stage  # the sweep's stages
        assert teams_of(seen, "daskjobs-attempt-scored") == {"quant"}  # the job's attempts
        assert teams_of(seen, "unstated-") == {"default"}
        clients = {r["client"]: r for r in daskjobs.status(c)["identities"]["clients"]}
        assert clients[c.id]["team"] == "quant" and other.id not in clients


def test_a_stated_team_unknown_while_teams_are_strict_is_refused() -> None:
    plugin = JobsPlugin(policy="fair-share", teams={"targets": {"quant": 1}, "strict": True})
    with (
        LocalCluster(
            n_workers=1,
            processes=False,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [plugin]},
        ) as lc,
        Client(lc) as c,
    ):
        with pytest.raises(TeamRefused, match=r"team 'ml' is not configured"):
            daskjobs.set_team(c, "ml")
        with pytest.raises(ValueError, match="no team given"):
            daskjobs.set_team(c)
        daskjobs.set_team(c, "quant")
        assert c.submit(inc, 1).result(timeout=30) == 2


def test_a_client_that_reconnects_keeps_the_team_it_stated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bound = teams(**BOUND)
    bound.connected("op", ("ops",))
    bound.state("op", "ml", ("ops",))
    bound.left("op")  # its connection dropped; dask reconnects it under the same id
    assert bound.graph_team("op", [task("a")]) == "default"  # gone: not connected
    bound.connected("op", ("ops",))
    assert bound.graph_team("op", [task("a")]) == "ml"  # the same certificate: its statement
    bound.left("op")
    bound.connected("op", ("alice",))  # another certificate under that id: nothing of it
    assert bound.describe("op")["source"] == "certificate"
    # the trusted model does not watch connections: the last statements are kept
    monkeypatch.setattr(identity, "REMEMBERED", 2)
    trusted = teams()
    for client, team in (("c1", "quant"), ("c2", "ml"), ("c3", "ml")):
        trusted.state(client, team, None)
    assert [r["client"] for r in trusted.rows()] == ["c2", "c3"]
    assert trusted.graph_team("c1", [task("a")]) == "default"
    assert trusted.graph_team("c2", [task("a")]) == "ml"


def test_a_certificate_of_an_unusual_shape_has_no_names() -> None:
    from daskjobs.plugin.surgery._internals import peer_names

    odd = SimpleNamespace(extra_info={"peercert": {"subject": 3}})
    assert peer_names(odd) == ()
    assert peer_names(SimpleNamespace(extra_info={"peercert": {}})) is None
