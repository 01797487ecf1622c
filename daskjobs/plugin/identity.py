"""Which team a client's graphs are charged to: the team it stated once, or its certificate's.

A task's team is its ``team`` annotation. A task without one is its client's: a client states
its team once (:func:`daskjobs.set_team`, which reads ``daskjobs.team`` of the client's dask
config, or the client preload :mod:`daskjobs.client_preload`, which calls it for every new
``Client``), and every graph it sends afterwards is charged to that team, whichever dask entry
point sent it (``compute``, ``persist``, ``submit``, ``map``, a ``Sweep``, a joblib search):
dask tells the plugin which client sent each graph. A graph a task submits from a worker
(``worker_client``, a sweep run as a job) keeps the team of the task that submitted it. A
client that stated nothing: ``teams.default``.

That is the trusted model: a client states what it likes and may annotate any team
(docs/explanation/trust.md). The operator who needs more binds teams to identity
(``teams.identities`` or ``teams.admins`` set): on a cluster secured with dask's TLS and client
certificates, each certificate identity (a subject common name or a subject alternative name)
maps to a team, and then

* a client's team is its certificate's, whatever it states (a statement naming another team
  is refused);
* a graph in which a task names another team is refused as a whole with a
  :class:`TeamRefused` naming the client's identity, its team and the team named, before
  anything of it is ranked or runs;
* an identity listed in ``teams.admins`` may act for any team (annotations, a stated team, a
  graph a task of that team submitted): each graph, statement or job that does is an
  ``acted-for`` event of the audit trail;
* a client whose certificate maps to no team, or that has none, gets ``teams.default``, or
  with ``teams.unmapped: refuse`` has every graph refused.

The certificate is read once per client, as it connects (dask keeps it on the connection:
:func:`~daskjobs.plugin.surgery._internals.watch_clients`), and each client's stream carries its own
graphs only, so a client cannot send a graph in another client's name. A client connected
before the plugin started has no certificate on record and counts as unmapped: load the plugin
with the scheduler (the preload). The scheduler's own clients (the jobs service's, which
launches attempts of jobs it checked when they were submitted) are trusted. A client that
reconnects (a dropped connection; dask keeps its id) keeps the team it stated: the plugin
keeps the statements of the last :data:`REMEMBERED` clients (in the trusted model, where
clients are not watched, of the last clients that stated one).

:class:`IdentityPart` is the plugin's part for it (:mod:`daskjobs.plugin.parts`): it gives
each new graph its team before anything else checks or ranks it, serves the clients'
``daskjobs_team`` requests, and reads each client's certificate as it connects.

Cost: O(1) per graph to pick the team; while teams are bound, O(tasks) per graph to read their
``team`` annotations. Nothing per transition.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from daskjobs.errors import SubmissionRefused
from daskjobs.plugin.parts import Part
from daskjobs.plugin.surgery import _internals as dask_internals

if TYPE_CHECKING:
    from dask.typing import Key

    from daskjobs.config import Settings, TeamSettings
    from daskjobs.plugin.audit import Audit
    from daskjobs.plugin.ranking import Ranker

__all__ = ["REMEMBERED", "Caller", "ClientTeams", "IdentityPart", "TeamRefused"]

#: How many clients' statements the plugin keeps beyond those connected (a client that
#: reconnects keeps its id and its team; the oldest statement goes first).
REMEMBERED = 10_000


class TeamRefused(SubmissionRefused):
    """A graph, a stated team or a job names a team its client's certificate may not act
    for, or comes from a client whose certificate maps to no team while the operator
    refuses those (``daskjobs.teams.unmapped: refuse``)."""


@dataclass(frozen=True, slots=True)
class Caller:
    """What the plugin knows of one client: its certificate's ``names`` (None: it connected
    without one, or before teams were bound), the ``identity`` among them the operator's
    map matched (else its first name), the ``team`` that identity maps to (None:
    unmapped), whether it is an ``admin``, and the team it ``stated`` (None: none)."""

    client: str
    names: tuple[str, ...] | None = None
    identity: str | None = None
    team: str | None = None
    admin: bool = False
    stated: str | None = None


class ClientTeams:
    """Each client's team (module docstring): ``clients`` by client id; ``trusted`` the
    scheduler's own clients; ``refused`` and ``acted_for`` count the graphs, statements
    and jobs refused and acted for another team."""

    def __init__(self, teams: TeamSettings, audit: Audit) -> None:
        self.teams = teams
        self.audit = audit
        self.bound = teams.bound
        self.clients: dict[str, Caller] = {}
        self.gone: dict[str, Caller] = {}  # bound: the last clients gone that stated a team
        self.trusted: set[str] = set()
        self.refused = 0
        self.acted_for = 0

    @property
    def settings(self) -> TeamSettings:
        return self.teams

    @settings.setter
    def settings(self, settings: Settings) -> None:
        """The plugin's settings in force (at start: a client's plugin takes the bound
        teams from the scheduler's config)."""
        self.teams = settings.teams
        self.bound = settings.teams.bound

    # -- who a client is ------------------------------------------------------------------
    def whose(self, names: tuple[str, ...] | None) -> tuple[str | None, str | None, bool]:
        """``(identity, team, admin)`` of a certificate with ``names``: the first name the
        operator maps to a team (else the first admin name, else the first name), that
        team (None: unmapped), and whether any name is an admin's. O(names)."""
        if not names:
            return None, None, False
        identities, admins = self.teams.identities, self.teams.admins
        admin = next((n for n in names if n in admins), None)
        for name in names:
            team = identities.get(name)
            if team is not None:
                return name, team, admin is not None
        return admin or names[0], None, admin is not None

    def connected(self, client: Any, names: tuple[str, ...] | None) -> bool:
        """Client ``client`` connects with a certificate of ``names`` (None: without one).
        False refuses it: its id is connected already with another certificate (a client
        cannot take another's id to send graphs in its name)."""
        if not isinstance(client, str):
            return True
        back = self.gone.pop(client, None)  # a reconnection: its statement, if the same certificate
        prev = self.clients.get(client)
        if prev is not None and prev.names != names:
            self.refused += 1
            identity = self.whose(names)[0]
            self.audit.event(
                "refused-client",
                client=client,
                identity=identity,
                reason=f"client id connected already as {_who(prev)}",
            )
            return False
        identity, team, admin = self.whose(names)
        was = prev if prev is not None else back
        stated = was.stated if was is not None and was.names == names else None
        self.clients[client] = Caller(client, names, identity, team, admin, stated)
        return True

    def left(self, client: str) -> None:
        """Client ``client``'s connection ended (teams bound: its statement is kept a
        while, for a reconnection with the same certificate)."""
        c = self.clients.pop(client, None)
        self.trusted.discard(client)
        if c is not None and c.stated is not None:
            _keep(self.gone, client, c)

    def _caller(self, client: str | None) -> Caller | None:
        return self.clients.get(client) if client is not None else None

    def trust(self, client: str) -> None:
        """``client`` is the scheduler's own (made in its process): its graphs' annotations
        are taken as they are, as in the trusted model."""
        self.trusted.add(client)

    def _own(self, c: Caller | None) -> str | None:
        """The team a client's graphs are charged to while teams are bound; None: it maps
        to no team and the operator refuses those."""
        if c is not None and c.team is not None:
            return c.team
        if (c is not None and c.admin) or self.teams.unmapped == "default":
            return self.teams.default
        return None

    # -- a graph ------------------------------------------------------------------------------
    def graph_team(
        self, client: str | None, tasks: Iterable[Any], inherited: str | None = None
    ) -> str:
        """The team of the tasks of ``client``'s new graph ``tasks`` without a ``team``
        annotation (``inherited``: the team of the task that submitted the graph, if a task
        did). While teams are bound, raises :class:`TeamRefused` if a task names a team the
        client may not act for (nothing of the graph is ranked yet), and records an
        ``acted-for`` event for an admin's graph charged to another team. O(1) in the
        trusted model, O(tasks) while bound."""
        c = self._caller(client)
        stated = c.stated if c is not None else None
        if not self.bound or client in self.trusted:
            return stated or inherited or self.teams.default
        own = self._own(c)
        if own is None:
            raise self._refuse(
                f"daskjobs refused this graph of {_who(c, client)}: its certificate maps to no "
                "team and the operator refuses those (daskjobs.teams.unmapped: refuse); nothing "
                "of it runs. Ask the operator to map it in daskjobs.teams.identities",
                client,
                c,
            )
        admin = c is not None and c.admin
        team = (stated or inherited or own) if admin else own
        named: dict[str, int] = {}
        plain = 0
        for ts in tasks:
            ann = ts.annotations
            if not ann or "team" not in ann:
                plain += 1
                continue
            t = str(ann["team"])
            if t == own:
                continue
            if not admin:
                raise self._refuse(
                    f"daskjobs refused this graph of {_who(c, client)}, whose team is {own!r}: "
                    f"task {_key(ts.key)} names team {t!r}, and only identities in "
                    "daskjobs.teams.admins act for another team; nothing of the graph runs",
                    client,
                    c,
                    named=t,
                )
            named[t] = named.get(t, 0) + 1
        if team != own and plain:
            named[team] = named.get(team, 0) + plain
        if named:
            self._acted(client, c, own, "graph", named)
        return team

    # -- a statement, a job ---------------------------------------------------------------
    def state(self, client: str, team: str | None, names: tuple[str, ...] | None) -> None:
        """Client ``client`` states its team (None: takes its statement back), over a
        connection whose certificate has ``names``. While teams are bound, raises
        :class:`TeamRefused` if that connection is not the client's own identity, or
        the team is not one the client may act for."""
        c = self._caller(client)
        if self.bound and client not in self.trusted:
            if c is None or c.names != names:
                raise self._refuse(
                    f"daskjobs refused a team statement for client {client} from "
                    f"{_who(Caller(client, names, self.whose(names)[0]))}: the client is "
                    f"{'not connected' if c is None else _who(c)}",
                    client,
                    c,
                )
            own = self._own(c)
            if own is None or (team is not None and team != own and not c.admin):
                why = (
                    "its certificate maps to no team (daskjobs.teams.unmapped: refuse)"
                    if own is None
                    else f"its team is {own!r}, and only identities in daskjobs.teams.admins "
                    "act for another team"
                )
                raise self._refuse(
                    f"daskjobs refused team {team!r} for {_who(c, client)}: {why}",
                    client,
                    c,
                    named=team,
                )
            if team is not None and team != own:
                self._acted(client, c, own, "statement", {team: 0})
        elif c is None:
            c = Caller(client)
        if self.bound:
            self.clients[client] = dataclasses.replace(c, stated=team)
        else:  # no watch of who connects and leaves: the last statements are kept
            self.clients.pop(client, None)
            _keep(self.clients, client, dataclasses.replace(c, stated=team))
        self.audit.event("team-stated", client=client, team=team, identity=c.identity)

    def job_team(
        self, client: str | None, names: tuple[str, ...] | None, team: str | None, job: str
    ) -> str:
        """The team of job ``job``, submitted over a connection whose certificate has
        ``names`` by client ``client``: the team it names (``team``), else its client's.
        While teams are bound the connection's own certificate decides, as for a graph
        (raises :class:`TeamRefused`)."""
        c = self._caller(client)
        if not self.bound:
            if team is not None:  # (a team it names, even a bad one: the spec's check says)
                return team
            return (c.stated if c is not None else None) or self.teams.default
        identity, mapped, admin = self.whose(names)
        caller = Caller(client or "", names, identity, mapped, admin)
        if c is not None and c.names == names:
            caller = dataclasses.replace(caller, stated=c.stated)
        own = self._own(caller)
        if own is None:
            raise self._refuse(
                f"daskjobs refused job {job!r} of {_who(caller, client)}: its certificate maps "
                "to no team (daskjobs.teams.unmapped: refuse)",
                client,
                caller,
            )
        if team is None:
            team = (caller.stated if admin else None) or own
        if team != own:
            if not admin:
                raise self._refuse(
                    f"daskjobs refused job {job!r} of {_who(caller, client)}, whose team is "
                    f"{own!r}: the job names team {team!r}, and only identities in "
                    "daskjobs.teams.admins act for another team",
                    client,
                    caller,
                    named=team,
                )
            self._acted(client, caller, own, "job", {team: 1})
        return team

    def rpc(
        self, client: Any, team: Any, action: str, names: tuple[str, ...] | None
    ) -> dict[str, Any]:
        """A client's request (the plugin's ``daskjobs_team`` handler): ``action="state"``
        states ``team`` (None takes the statement back), ``"describe"`` asks; ``names``:
        the certificate of the request's connection. :meth:`describe`'s answer, or
        ``{"refused": message}``."""
        if not isinstance(client, str) or not client:
            return {"refused": f"daskjobs: expected a client id, got {client!r}"}
        t = self.teams
        try:
            if action == "state":
                if team is not None and (not isinstance(team, str) or not team):
                    raise TeamRefused(f"daskjobs: expected a team name, got {team!r}")
                if team is not None and t.strict and team not in t.targets:
                    raise TeamRefused(
                        f"daskjobs: team {team!r} is not configured on this scheduler and teams "
                        f"are strict (daskjobs.teams.targets has: "
                        f"{', '.join(sorted(t.targets)) or 'no teams'})"
                    )
                self.state(client, team, names)
            elif action != "describe":
                raise TeamRefused(f"daskjobs: unknown team action {action!r}")
            return self.describe(client)
        except SubmissionRefused as e:
            return {"refused": str(e)}

    # -- what it tells ----------------------------------------------------------------------
    def describe(self, client: str) -> dict[str, Any]:
        """What the plugin makes of ``client``: the team its graphs without a ``team``
        annotation are charged to (None: they are refused), its identity, whether it is an
        admin, and where the team comes from (``certificate``, ``stated``, ``default``)."""
        c = self._caller(client)
        stated = c.stated if c is not None else None
        team: str | None
        if not self.bound or client in self.trusted:
            team = stated or self.teams.default
            source = "stated" if stated else "default"
        else:
            own = self._own(c)
            admin = c is not None and c.admin
            team = (stated if admin else None) or own
            if admin and stated:
                source = "stated"
            elif c is not None and c.team is not None:
                source = "certificate"
            else:
                source = "default" if own is not None else "refused"
        return {
            "client": client,
            "team": team,
            "identity": c.identity if c is not None else None,
            "admin": bool(c is not None and c.admin),
            "source": source,
        }

    def rows(self) -> list[dict[str, Any]]:
        """:meth:`describe` of every client the plugin knows, by client id."""
        return [self.describe(client) for client in sorted(self.clients)]

    def identities_by_team(self) -> dict[str, list[str]]:
        """Per team, the identities of the connected clients charged to it."""
        out: dict[str, set[str]] = {}
        for row in self.rows():
            if row["identity"] is not None and row["team"] is not None:
                out.setdefault(row["team"], set()).add(row["identity"])
        return {team: sorted(ids) for team, ids in out.items()}

    def status(self) -> dict[str, Any]:
        return {
            "bound": self.bound,
            "refused": self.refused,
            "acted_for": self.acted_for,
            "clients": self.rows(),
        }

    # -- helpers ----------------------------------------------------------------------------
    def _refuse(
        self,
        message: str,
        client: str | None,
        c: Caller | None,
        named: str | None = None,
    ) -> TeamRefused:
        self.refused += 1
        self.audit.event(
            "refused-team",
            client=client,
            identity=c.identity if c is not None else None,
            team=self._own(c) if self.bound else None,
            named=named,
            error=message,
        )
        return TeamRefused(message)

    def _acted(
        self, client: str | None, c: Caller | None, own: str, what: str, teams: dict[str, int]
    ) -> None:
        self.acted_for += 1
        self.audit.event(
            "acted-for",
            client=client,
            identity=c.identity if c is not None else None,
            team=own,
            what=what,
            teams=dict(sorted(teams.items())),
        )


class IdentityPart(Part):
    """The plugin's part for each client's team (module docstring): decides each new
    graph's team (the ranker's ``graph_team``) or refuses the graph, serves the clients'
    ``daskjobs_team`` requests, and, with teams bound, reads each client's certificate as
    it connects (:func:`~daskjobs.plugin.surgery._internals.watch_clients`)."""

    name = "teams"
    refusals = (TeamRefused,)

    def __init__(self, teams: ClientTeams, ranker: Ranker) -> None:
        self.teams = teams
        self.ranker = ranker
        self.scheduler: Any = None
        self._watch: tuple[Any, Any] | None = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        scheduler.handlers["daskjobs_team"] = self._rpc
        if self.teams.bound:
            t = self.teams
            self._watch = dask_internals.watch_clients(scheduler, self._connected, t.left)

    async def close(self) -> None:
        if self.scheduler is not None:
            dask_internals.unwatch_clients(self.scheduler, self._watch)
        self._watch = None

    def check_graph(self, new: list[Any], graph: Any = None) -> None:
        """``graph``'s team (its tasks without a ``team`` annotation): its client's, or the
        team of the task that submitted it; raises :class:`TeamRefused`."""
        ranker = self.ranker
        ranker.graph_team = None  # until decided: the default
        if graph is None:
            return
        parent = graph.submitting_task
        v = ranker.tasks.get(parent) if parent is not None else None
        ranker.graph_team = self.teams.graph_team(graph.client, new, v.team if v else None)

    def status(self) -> dict[str, Any]:
        return {"identities": self.teams.status()}

    def _connected(self, client: Any, names: tuple[str, ...] | None) -> bool:
        try:
            return self.teams.connected(client, names)
        except Exception:  # never into dask: the client connects, as unmapped
            self.teams.audit.failed(self.name, client)
            return True

    def _rpc(
        self, comm: Any, client_id: Any = None, team: Any = None, action: str = "state"
    ) -> dict[str, Any]:
        """A client states its team, or asks what the plugin makes of it
        (:meth:`ClientTeams.rpc`); ``comm``: the request's connection. Once the plugin was
        unregistered (dask keeps handlers), it says so."""
        sched = self.scheduler
        if not any(getattr(p, "identities", None) is self.teams for p in sched.plugins.values()):
            return {"daskjobs": "removed"}
        names = dask_internals.peer_names(comm) if self.teams.bound else None
        return self.teams.rpc(client_id, team, action, names)


def _keep(table: dict[str, Caller], client: str, c: Caller) -> None:
    """``table[client] = c``, the oldest entry dropped beyond :data:`REMEMBERED`."""
    table[client] = c
    if len(table) > REMEMBERED:
        del table[next(iter(table))]


def _who(c: Caller | None, client: str | None = None) -> str:
    """A client as a message names it: its certificate identity, or that it has none."""
    name = client if client is not None else (c.client if c is not None else "?")
    if c is None or c.names is None:
        return f"client {name} (no certificate)"
    if c.identity is None:
        return f"client {name} (a certificate without a name)"
    return f"client {name} (certificate identity {c.identity!r})"


def _key(key: Key) -> str:
    text = repr(key)
    return text if len(text) <= 120 else text[:117] + "..."
