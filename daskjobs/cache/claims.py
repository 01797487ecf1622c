"""Claims: one computation of a stage across clusters that share a result store.

Two clusters sharing a store (two researchers' ``LocalCluster``s, a laptop and the
shared cluster) each see that a feature stage is not stored yet and each compute it.
The store's commit is atomic, so nothing is corrupted, but the work is done twice.
A *claim* is how the second one waits for the first instead.

Before computing a cacheable stage the store has no entry for, the task takes the
key's claim: a small JSON file ``claims/<key>/<token>.json`` created only if absent
(exclusive create: ``O_EXCL`` on local files, ``mode="xb"`` on fsspec filesystems
that honour it, such as ``memory://``; on one that does not, a claim is a best
effort and the store's first-writer-wins commit still keeps one entry visible).
``token`` is the claim's *fencing token*: 1 for the first claim of a key, one more
for each claim taken after an earlier one expired, so a later owner always holds a
larger token. The claim names its owner (host, process, cluster address where known)
and expires ``lease`` seconds after it was last renewed; its owner renews it every
``lease / 3`` while it computes, from a daemon thread.

Another cluster's task for the same key finds the claim live and *waits*: it polls
(0.1 s, doubling to 2 s) until the entry lands (then loads it), the claim is
released without an entry or expires (its owner died, or lost its network: then it
takes the next token and computes), or ``max_wait`` passes (then it computes
without a claim and says so in the log: no claim blocks for ever). A waiting task
holds its worker thread.

Fencing: an owner whose claim was taken over (it was partitioned or stopped for
longer than its lease) still returns its value to its own client, but does not
commit it: the new owner's commit is the visible one. After taking a claim the
claimer looks for the entry once more, which closes the race with an owner that
committed and cleaned up between the claimer's first look and its claim.

Clocks: expiry compares wall-clock times written by different machines, so the
lease must be much longer than their clock skew (the default, 60 s, assumes NTP).

Cost: a claim is one small file written, renewed every ``lease / 3`` while the
stage computes, and removed (with the key's whole claims folder) once the entry is
committed; a waiter lists one folder per poll.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daskjobs.cache.store import ResultStore

__all__ = ["DEFAULT_LEASE", "DEFAULT_MAX_WAIT", "Claim", "ClaimInfo", "Claims"]

logger = logging.getLogger("daskjobs.cache")

#: Seconds a claim lives without renewal.
DEFAULT_LEASE = 60.0
#: Seconds a task waits for another cluster's claim before computing anyway.
DEFAULT_MAX_WAIT = 3600.0
_POLL_FIRST = 0.1
_POLL_MAX = 2.0


@dataclass(frozen=True)
class ClaimInfo:
    """What a claim file says: the key, its fencing token, its owner, when it expires
    (seconds since the epoch) and whether its owner released it."""

    key: str
    token: int
    owner: str
    expires: float
    released: bool = False
    #: the scheduler address of the owner's cluster (None off a dask worker)
    cluster: str | None = None
    #: the owner's worker address (None off a dask worker)
    worker: str | None = None

    def live(self, now: float | None = None) -> bool:
        return not self.released and (time.time() if now is None else now) < self.expires

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "token": self.token,
            "owner": self.owner,
            "expires": self.expires,
            "released": self.released,
            "cluster": self.cluster,
            "worker": self.worker,
        }


def _owner() -> tuple[str, str | None, str | None]:
    """Who takes a claim: text for people, the cluster (its scheduler's address) and
    the worker's address (both None off a dask worker)."""
    where = f"{socket.gethostname()}:{os.getpid()}"
    try:
        from distributed import get_worker

        worker = get_worker()
        cluster = str(worker.scheduler.address)
        return f"{where} (worker {worker.address} of scheduler {cluster})", cluster, worker.address
    except (ImportError, ValueError, AttributeError):
        return where, None, None


def _worker_alive(address: str | None) -> bool:
    """Whether ``address`` is a worker of the cluster this task runs on (asked of its
    scheduler; True when that cannot be told, so that no live claim is taken on a guess)."""
    if address is None:
        return True
    try:
        from distributed import get_client

        info = get_client().scheduler_info(n_workers=-1)
        return address in info.get("workers", {})
    except Exception:
        return True


class Claim:
    """A claim this process holds: renewed in the background until :meth:`release`."""

    def __init__(self, claims: Claims, info: ClaimInfo) -> None:
        self.claims = claims
        self.info = info
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def token(self) -> int:
        return self.info.token

    @property
    def lost(self) -> bool:
        """Whether a later claim superseded this one (its lease expired meanwhile)."""
        return self._lost.is_set() or not self.claims.current(self.info)

    def start_renewing(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._renew, name=f"daskjobs-claim-{self.info.key[:24]}", daemon=True
            )
            self._thread.start()

    def _renew(self) -> None:
        period = self.claims.lease / 3
        while not self._stop.wait(period):
            try:
                if not self.claims.current(self.info):
                    self._lost.set()
                    return
                self.info = self.claims._write(
                    dataclasses.replace(self.info, expires=time.time() + self.claims.lease),
                    create=False,
                )
            except Exception as err:  # the store is unreachable: the lease runs out
                logger.debug("could not renew the claim on %s: %r", self.info.key, err)

    def release(self, committed: bool) -> None:
        """Stop renewing; remove the key's claims if the entry was ``committed``, else
        mark this claim released so that a waiter takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if committed:
                self.claims.remove(self.info.key)
            elif self.claims.current(self.info):
                self.claims._write(
                    dataclasses.replace(self.info, expires=0.0, released=True), create=False
                )
        except Exception as err:  # it expires on its own
            logger.debug("could not release the claim on %s: %r", self.info.key, err)


class Claims:
    """The claims of a :class:`~daskjobs.cache.store.ResultStore` (see the module docstring)."""

    def __init__(
        self,
        store: ResultStore,
        lease: float = DEFAULT_LEASE,
        max_wait: float = DEFAULT_MAX_WAIT,
    ) -> None:
        if not lease > 0:
            raise ValueError(f"claim lease must be > 0 seconds, got {lease!r}")
        if not max_wait >= 0:
            raise ValueError(f"claim max-wait must be >= 0 seconds, got {max_wait!r}")
        self.store = store
        self.lease = float(lease)
        self.max_wait = float(max_wait)

    # -- files ----------------------------------------------------------------------------------
    def _folder(self, key: str) -> str:
        self.store._manifest_path(key)  # checks the key
        return f"{self.store.root}/claims/{key}"

    def _path(self, key: str, token: int) -> str:
        return f"{self._folder(key)}/{token:012d}.json"

    def _write(self, info: ClaimInfo, create: bool) -> ClaimInfo:
        """Write ``info``; with ``create``, only if no claim with its token exists
        (raises ``FileExistsError`` otherwise)."""
        path = self._path(info.key, info.token)
        body = json.dumps(info.to_json()).encode()
        fs = self.store.fs
        if self.store._local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if create:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                with os.fdopen(fd, "wb") as f:
                    f.write(body)
            else:  # renewals: a reader never sees half a file
                tmp = f"{path}.{uuid.uuid4().hex}.tmp"
                with open(tmp, "wb") as f:
                    f.write(body)
                os.replace(tmp, path)
            return info
        fs.makedirs(os.path.dirname(path), exist_ok=True)
        if create:
            try:
                with fs.open(path, "xb") as f:
                    f.write(body)
            except (ValueError, NotImplementedError):  # no exclusive create here
                if fs.exists(path):
                    raise FileExistsError(path) from None
                fs.pipe_file(path, body)
        else:
            fs.pipe_file(path, body)
        return info

    def _tokens(self, key: str) -> list[int]:
        folder = self._folder(key)
        try:
            names = self.store.fs.ls(folder, detail=False)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            base = str(name).rstrip("/").rsplit("/", 1)[-1]
            if base.endswith(".json") and base[:-5].isdigit():
                out.append(int(base[:-5]))
        return sorted(out)

    def read(self, key: str, token: int) -> ClaimInfo | None:
        try:
            data = json.loads(self.store.fs.cat_file(self._path(key, token)))
            cluster = data.get("cluster")
            worker = data.get("worker")
            return ClaimInfo(
                str(data["key"]),
                int(data["token"]),
                str(data["owner"]),
                float(data["expires"]),
                bool(data.get("released", False)),
                None if cluster is None else str(cluster),
                None if worker is None else str(worker),
            )
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as err:  # a torn or foreign file: expired
            logger.warning(
                "claim %s/%s is unreadable (%r); treating it as expired", key, token, err
            )
            return ClaimInfo(key, token, "?", 0.0, False)

    def latest(self, key: str) -> ClaimInfo | None:
        """The key's claim with the largest token, or None."""
        tokens = self._tokens(key)
        return self.read(key, tokens[-1]) if tokens else None

    def current(self, info: ClaimInfo) -> bool:
        """Whether ``info`` is still the key's latest claim (no later token was taken)."""
        tokens = self._tokens(info.key)
        return bool(tokens) and tokens[-1] == info.token

    def remove(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.store.fs.rm(self._folder(key), recursive=True)

    def ls(self) -> list[ClaimInfo]:
        """The latest claim of every key that has one (released and expired included)."""
        folder = f"{self.store.root}/claims"
        try:
            keys = [
                str(p).rstrip("/").rsplit("/", 1)[-1]
                for p in self.store.fs.ls(folder, detail=False)
            ]
        except FileNotFoundError:
            return []
        out = []
        for key in sorted(keys):
            info = self.latest(key)
            if info is not None:
                out.append(info)
        return out

    # -- taking a claim -------------------------------------------------------------------------
    def try_claim(self, key: str, *, over: ClaimInfo | None = None) -> Claim | None:
        """Take ``key``'s claim if nobody holds a live one; None if somebody does (or
        another process took the same token first). ``over``: take the next token even
        though this claim is live (its owner is known dead)."""
        latest = self.latest(key)
        if latest is not None and latest.live() and latest != over:
            return None
        token = 1 if latest is None else latest.token + 1
        owner, cluster, worker = _owner()
        info = ClaimInfo(
            key, token, owner, time.time() + self.lease, cluster=cluster, worker=worker
        )
        try:
            self._write(info, create=True)
        except FileExistsError:
            return None
        return Claim(self, info)

    def acquire(
        self,
        key: str,
        stored: Callable[[], bool],
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> tuple[str, Claim | None]:
        """Wait for ``key``: ``("stored", None)`` once ``stored()`` is true;
        ``("claimed", claim)`` once this process holds the claim (compute, then
        :meth:`Claim.release`); ``("ours", None)`` if the live claim is held by a
        live worker of this very cluster (dask already runs one task per key: a second
        one is a backup copy, which must not wait for the first; a claim of a worker
        this cluster lost is taken over at once); ``("gave-up", None)``
        after ``max_wait`` (compute without a claim). Other errors of the store
        propagate."""
        deadline = clock() + self.max_wait
        pause = _POLL_FIRST
        waited_for: str | None = None
        while True:
            if stored():
                return "stored", None
            claim = self.try_claim(key)
            if claim is not None:
                if stored():  # committed and cleaned up between our look and our claim
                    claim.release(committed=False)
                    return "stored", None
                if waited_for:
                    logger.info(
                        "took over the claim on %s (token %d) after %s stopped renewing it",
                        key,
                        claim.token,
                        waited_for,
                    )
                claim.start_renewing()
                return "claimed", claim
            latest = self.latest(key)
            if (
                latest is not None
                and latest.live()
                and latest.cluster is not None
                and latest.cluster == _owner()[1]
            ):
                if _worker_alive(latest.worker):
                    return "ours", None
                # our own cluster lost the owner's worker: its claim is dead before it expires
                claim = self.try_claim(key, over=latest)
                if claim is not None:
                    claim.start_renewing()
                    return "claimed", claim
                continue
            if waited_for is None:
                waited_for = latest.owner if latest is not None else "another process"
                logger.info("%s is being computed by %s; waiting for it", key, waited_for)
            if clock() >= deadline:
                logger.warning(
                    "waited %.0f s for %s to be computed by %s; computing it here",
                    self.max_wait,
                    key,
                    waited_for,
                )
                return "gave-up", None
            sleep(min(pause, max(0.0, deadline - clock())))
            pause = min(pause * 2, _POLL_MAX)
