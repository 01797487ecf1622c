"""The result store: stage results kept under their content keys, on any fsspec filesystem.

A store is a directory: local by default (nothing to start), or any fsspec URL for storage
shared between machines (``s3://bucket/prefix`` through s3fs, ``gcs://``, ``memory://`` in
tests). Its layout::

    <root>/daskjobs-store-v1/
        entries/<key>.json          the manifest: the commit point of an entry
        data/<key>/<nonce>.bin      payloads, one unique file per writer
        tmp/                        manifests being written (local filesystems)

Writing an entry
----------------
1. The value is serialized (cloudpickle, protocol 5, with numpy buffers written out-of-band:
   they go to the file as they are, not through the pickle stream) into a payload file whose
   name is unique to this writer, so two writers never touch the same file.
2. A manifest holding the payload's BLAKE2b checksum, its size and the metadata (key, stage,
   parameters, code hash, compute seconds, created, writer) is committed under
   ``entries/<key>.json``. On a local filesystem it is written to ``tmp/`` and hard-linked into
   place, which fails if the entry exists: the first writer wins, later writers delete their
   payload and report that they lost. On other filesystems it is written to a temporary name
   and copied into place (a copy is atomic on object stores and in memory); two writers racing
   there both leave complete entries and the later copy is the visible one.

``put(..., replace=True)`` (a forced or expired recompute) overwrites instead: the new
manifest is renamed over the old one (local) or copied over it, so a reader sees one entry or
the other, and the old payload is left for a reader holding the old manifest, until
:meth:`ResultStore.gc` collects it after the grace period. A manifest also records the
parameters the key left out (``ignored``) and the entry's ``max_age``; ``gc`` removes the
entries past it. Manifests written before those fields read as ignoring nothing and never
expiring.

Until the manifest exists the entry does not exist, so a writer that dies between payload and
commit leaves only an orphan payload, which :meth:`ResultStore.gc` removes later. Removing an
entry removes its manifest, then only the payload that manifest names: a writer putting the same
key again at that moment keeps its fresh payload.

Reading an entry
----------------
The manifest names the payload; the payload's size is checked against the file before anything
is allocated, and its checksum is recomputed on every read. A missing, truncated or altered
payload, an absurd size or an unreadable manifest is logged as a warning, removed, and reported
as a miss (:class:`CorruptEntryError`, a ``KeyError``), so the caller recomputes. A corrupt
entry is never returned. In a store this process cannot write, the entry is left in place (with
a warning) and is still a miss.

Looking never changes the store: :meth:`ResultStore.info`, :meth:`~ResultStore.ls`,
``verify(remove=False)`` and ``gc(dry_run=True)`` remove nothing, whatever they find. A store
that cannot be written or listed raises :class:`StoreAccessError` (an ``OSError``) naming it.

Trust
-----
Loading an entry unpickles it, and unpickling runs code. Anyone who can write to a store can run
code in every process that reads from it: make a shared store writable only by people you trust.
"""

from __future__ import annotations

import contextlib
import errno
import getpass
import hashlib
import json
import logging
import math
import os
import pickle
import re
import socket
import struct
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

__all__ = [
    "CorruptEntryError",
    "EntryInfo",
    "GCReport",
    "ResultStore",
    "StoreAccessError",
    "VerifyReport",
    "default_store_url",
]

logger = logging.getLogger("daskjobs.cache")

DEFAULT_STORE_DIR = ".daskjobs-cache"
_LAYOUT = "daskjobs-store-v1"
_MAGIC = b"DJS1"
_ALIGN = 64
_HEADER = struct.Struct("<4sIQ")  # magic, number of buffers, pickle length
_ORPHAN_GRACE = 3600.0  # seconds before gc treats an uncommitted payload as abandoned


_PAYLOAD_NAME = re.compile(r"[A-Za-z0-9_-]+\.bin")


class CorruptEntryError(KeyError):
    """A stored entry failed its checksum or could not be read: a miss, never a value.

    ``reason`` says what is wrong. :meth:`ResultStore.get` removes the entry before raising;
    if the store cannot be written, ``left`` says why it is still there (a new value cannot be
    stored under the key until it is removed). Looking at it (``info``) removes nothing.
    """

    def __init__(self, key: str, reason: str = "", left: str | None = None) -> None:
        super().__init__(key)
        self.key = key
        self.reason = reason
        self.left = left


class StoreAccessError(OSError):
    """The store cannot be used as asked: its path is a file or missing, or it cannot be
    written (read-only, full). The message names the store and the cause."""


def _hint(err: BaseException) -> str:
    if isinstance(err, PermissionError) or getattr(err, "errno", None) == errno.EROFS:
        return " (the store is read-only here)"
    return ""


def default_store_url() -> str:
    """The store used when none is given.

    In order: the ``DASKJOBS_STORE`` environment variable, the dask config key
    ``daskjobs.store``, then ``./.daskjobs-cache`` in the current working directory.
    """
    env = os.environ.get("DASKJOBS_STORE")
    if env:
        return env
    import dask.config

    configured = dask.config.get("daskjobs.store", None)
    if configured:
        return str(configured)
    return os.path.abspath(DEFAULT_STORE_DIR)


@dataclass(frozen=True)
class EntryInfo:
    """The metadata of one committed entry (its manifest)."""

    key: str
    stage: str
    params: Mapping[str, Any]
    code_hash: str
    compute_seconds: float
    nbytes: int
    created: float
    writer: str
    checksum: str
    payload: str
    #: parameters the stage left out of the key (``ignore=``); () in manifests before them
    ignored: tuple[str, ...] = ()
    #: seconds after ``created`` at which the entry expires (``max_age=``), None for never
    max_age: float | None = None

    @property
    def expires(self) -> float | None:
        """When the entry expires (a ``time.time()``), or None if it never does."""
        return None if self.max_age is None else self.created + self.max_age

    def expired(self, now: float | None = None) -> bool:
        """Whether the entry is older than the ``max_age`` it was written with."""
        expires = self.expires
        return expires is not None and (time.time() if now is None else now) > expires

    def to_json(self) -> dict[str, Any]:
        return {
            "format": 1,
            "key": self.key,
            "stage": self.stage,
            "params": dict(self.params),
            "code_hash": self.code_hash,
            "compute_seconds": self.compute_seconds,
            "nbytes": self.nbytes,
            "created": self.created,
            "writer": self.writer,
            "checksum": self.checksum,
            "payload": self.payload,
            "ignored": list(self.ignored),
            "max_age": self.max_age,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EntryInfo:
        """The manifest's fields; ``ValueError`` if one is missing, of the wrong type, or
        impossible (a negative size, a payload outside ``data/<key>/``)."""
        info = cls(
            key=str(data["key"]),
            stage=str(data["stage"]),
            params=dict(data["params"]),
            code_hash=str(data["code_hash"]),
            compute_seconds=float(data["compute_seconds"]),
            nbytes=data["nbytes"],
            created=float(data["created"]),
            writer=str(data["writer"]),
            checksum=str(data["checksum"]),
            payload=str(data["payload"]),
            ignored=tuple(str(name) for name in data.get("ignored") or ()),
            max_age=_max_age(data.get("max_age")),
        )
        if isinstance(info.nbytes, bool) or not isinstance(info.nbytes, int) or info.nbytes < 0:
            raise ValueError(f"nbytes must be a whole number >= 0, got {info.nbytes!r}")
        prefix = f"data/{info.key}/"
        name = info.payload[len(prefix) :]
        if not info.payload.startswith(prefix) or not _PAYLOAD_NAME.fullmatch(name):
            raise ValueError(f"payload {info.payload!r} is not a file under {prefix}")
        return info


def _max_age(value: Any) -> float | None:
    """A manifest's or a caller's ``max_age``: seconds > 0 and finite, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"max_age must be a number of seconds > 0 or None, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"max_age must be a number of seconds > 0 or None, got {value!r}")
    return float(value)


def duration_text(seconds: float) -> str:
    """A duration as one whole unit where it divides evenly (``"7d"``, ``"1h"``,
    ``"90s"``): how ``cache gc`` names an entry's max_age."""
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span and seconds % span == 0:
            return f"{seconds / span:g}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class VerifyReport:
    """What :meth:`ResultStore.verify` found: keys that passed and keys that failed.

    ``removed`` says whether removal was asked for; ``not_removed`` maps the corrupt keys that
    could not be removed (a read-only store) to the reason.
    """

    ok: tuple[str, ...]
    corrupt: tuple[str, ...]
    removed: bool
    not_removed: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GCReport:
    """What :meth:`ResultStore.gc` removed (or would remove, with ``dry_run``)."""

    removed: tuple[str, ...]
    freed_bytes: int
    kept: int
    kept_bytes: int
    orphans: int = 0
    dry_run: bool = False
    reasons: Mapping[str, str] = field(default_factory=dict)


def _checksum(data: bytes | bytearray | memoryview) -> str:
    return "blake2b:" + hashlib.blake2b(data, digest_size=32).hexdigest()


def _pad(n: int) -> int:
    return (-n) % _ALIGN


def serialize(value: object) -> list[bytes | memoryview]:
    """Frame ``value`` as payload chunks: header, lengths, pickle, then aligned raw buffers."""
    buffers: list[pickle.PickleBuffer] = []
    body = cloudpickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    head = _HEADER.pack(_MAGIC, len(raws), len(body))
    lengths = struct.pack(f"<{len(raws)}Q", *(r.nbytes for r in raws))
    chunks: list[bytes | memoryview] = [head, lengths, body]
    offset = len(head) + len(lengths) + len(body)
    for raw in raws:
        chunks.append(b"\0" * _pad(offset))
        offset += _pad(offset)
        chunks.append(raw)
        offset += raw.nbytes
    return chunks


def deserialize(data: bytearray | bytes) -> object:
    """Inverse of :func:`serialize`; numpy arrays come back as views into ``data``."""
    view = memoryview(data)
    magic, nbuf, body_len = _HEADER.unpack_from(view, 0)
    if magic != _MAGIC:
        raise ValueError("not a daskjobs payload (bad magic number)")
    offset = _HEADER.size
    lengths = struct.unpack_from(f"<{nbuf}Q", view, offset)
    offset += 8 * nbuf
    body = view[offset : offset + body_len]
    offset += body_len
    buffers = []
    for n in lengths:
        offset += _pad(offset)
        buffers.append(view[offset : offset + n])
        offset += n
    if offset != len(view):
        raise ValueError(f"payload is {len(view)} bytes, its frame says {offset}")
    return pickle.loads(body, buffers=buffers)


def _writer() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no user name in some containers
        user = "unknown"
    who = f"{user}@{socket.gethostname()}:{os.getpid()}"
    try:
        from distributed import get_worker

        who += f" worker={get_worker().address}"
    except (ImportError, ValueError):
        pass
    return who


def _jsonable(value: object) -> Any:
    """Parameters as JSON for the manifest (metadata only: the key holds the real identity)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        return _jsonable(item())
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


class ResultStore:
    """Results under content keys, in a local directory or at any fsspec URL.

    ``ResultStore()`` opens the default store (:func:`default_store_url`);
    ``ResultStore("s3://bucket/sweeps", anon=False)`` passes keyword arguments to fsspec.
    A store pickles as its URL and options, so tasks can carry it to workers and write there.
    """

    def __init__(self, url: str | os.PathLike[str] | None = None, **storage_options: Any) -> None:
        url = os.fspath(url) if url is not None else default_store_url()
        if "://" not in url and "::" not in url:
            url = os.path.abspath(url)  # workers may run elsewhere: never relative
        self.url = url
        self.storage_options = dict(storage_options)
        self._fs: Any = None
        self._base = ""
        self._root = ""

    # -- plumbing ---------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], **state["storage_options"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"ResultStore({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ResultStore)
            and other.url == self.url
            and other.storage_options == self.storage_options
        )

    def __hash__(self) -> int:
        return hash(self.url)

    def __dask_tokenize__(self) -> object:
        return ("ResultStore", self.url, sorted(self.storage_options.items()))

    @property
    def fs(self) -> Any:
        if self._fs is None:
            from fsspec.core import url_to_fs

            fs, root = url_to_fs(self.url, **self.storage_options)
            self._base = root.rstrip("/")
            self._root = f"{self._base}/{_LAYOUT}"
            self._fs = fs
        return self._fs

    @property
    def root(self) -> str:
        self.fs  # noqa: B018 - resolves the root
        return self._root

    @property
    def _local(self) -> bool:
        from fsspec.implementations.local import LocalFileSystem

        return isinstance(self.fs, LocalFileSystem)

    def _manifest_path(self, key: str) -> str:
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"{key!r} is not a valid store key")
        return f"{self.root}/entries/{key}.json"

    # -- the API ----------------------------------------------------------------------------

    def contains(self, key: str) -> bool:
        """Whether an entry is committed under ``key`` (its payload is checked only on read)."""
        return bool(self.fs.exists(self._manifest_path(key)))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.contains(key)

    def contains_many(self, keys: Iterable[str]) -> set[str]:
        """The subset of ``keys`` that are stored: one listing for many keys, else lookups."""
        wanted = list(dict.fromkeys(keys))
        if len(wanted) <= 32:
            return {k for k in wanted if self.contains(k)}
        return set(wanted) & set(self.keys())

    def check_location(self) -> bool:
        """Whether a store has been written at :attr:`url`.

        ``False`` if the location exists (or, on an object store, may exist) but holds no
        store yet; :class:`StoreAccessError` if it is a file or, on a local filesystem, does
        not exist.
        """
        fs = self.fs
        if fs.isfile(self._base) or fs.isfile(self._root):
            where = self.url if fs.isfile(self._base) else self._root
            raise StoreAccessError(f"{where} is a file, not a store directory")
        if self._local and not fs.isdir(self._base):
            raise StoreAccessError(f"no store at {self.url}: the directory does not exist")
        return bool(fs.isdir(self._root))

    def keys(self) -> list[str]:
        """Keys of all committed entries."""
        try:
            names = self.fs.ls(f"{self.root}/entries", detail=False)
        except FileNotFoundError:
            return []
        except OSError as err:  # e.g. the store's path is a file
            raise StoreAccessError(
                f"cannot list the daskjobs store {self.url}: {type(err).__name__}: {err}"
            ) from err
        out = []
        for name in names:
            base = str(name).rstrip("/").rsplit("/", 1)[-1]
            if base.endswith(".json"):
                out.append(base[: -len(".json")])
        return sorted(out)

    def info(self, key: str) -> EntryInfo:
        """The manifest of ``key``; ``KeyError`` if absent, :class:`CorruptEntryError` if
        unreadable (nothing is removed: looking never changes the store)."""
        info, problem = self._manifest(key)
        if info is None:
            raise CorruptEntryError(key, problem or "unreadable manifest")
        return info

    def infos(self, keys: Iterable[str]) -> dict[str, EntryInfo]:
        """The manifests of ``keys`` that are stored and readable, fetched together (one
        request per key, concurrent on object stores). Missing and unreadable ones are left
        out: a read of the value finds and reports those."""
        paths = {self._manifest_path(k): k for k in dict.fromkeys(keys)}
        if not paths:
            return {}
        try:
            found = self.fs.cat(list(paths), on_error="omit")
        except FileNotFoundError:
            return {}
        out = {}
        for path, raw in found.items():
            key = paths.get(path) or paths.get(self.fs._strip_protocol(path))
            if key is None:
                continue
            try:
                info = EntryInfo.from_json(json.loads(raw))
            except (ValueError, KeyError, TypeError):
                continue
            if info.key == key:
                out[key] = info
        return out

    def get(self, key: str) -> Any:
        """The value stored under ``key``.

        Raises ``KeyError`` if there is none, and :class:`CorruptEntryError` (a ``KeyError``)
        if the entry is corrupt; the corrupt entry is logged and removed first (or, if the
        store cannot be written, logged and left in place).
        """
        info, problem = self._manifest(key)
        data = None
        if info is not None:
            data, problem = self._payload(info)
        if problem is not None or data is None:
            problem = problem or "unreadable"
            left = self._discard_corrupt(key, problem, info)
            raise CorruptEntryError(key, problem, left)
        try:
            return deserialize(data)
        except Exception as err:
            # The bytes are the ones that were written, so this is not corruption (e.g. a
            # module the value needs is missing here): report it as it is.
            raise RuntimeError(
                f"stored entry {key!r} passed its checksum but could not be unpickled: {err}"
            ) from err

    def put(
        self,
        key: str,
        value: object,
        *,
        stage: str = "",
        params: Mapping[str, Any] | None = None,
        code_hash: str = "",
        compute_seconds: float = 0.0,
        ignored: Iterable[str] = (),
        max_age: float | None = None,
        replace: bool = False,
    ) -> bool:
        """Store ``value`` under ``key``; True if this call committed the visible entry.

        False means an entry already existed (another writer won); this writer's payload is
        removed and the existing entry is left untouched. With ``replace`` an existing entry
        is overwritten instead, atomically: the new manifest takes the old one's place in
        one step, and the old payload stays (for a reader that read the old manifest just
        before) until :meth:`gc` collects it after its grace period.

        ``ignored`` names the parameters the key left out; ``max_age`` (seconds > 0) is
        when the entry expires, which :meth:`gc` honours.
        """
        manifest = self._manifest_path(key)
        meta = {
            "stage": stage,
            "params": params,
            "code_hash": code_hash,
            "compute_seconds": compute_seconds,
            "ignored": tuple(str(name) for name in ignored),
            "max_age": _max_age(max_age),
        }
        try:
            return self._put(manifest, key, value, meta, replace)
        except OSError as err:
            raise StoreAccessError(
                f"cannot write to the daskjobs store {self.url}: {type(err).__name__}: {err}"
                f"{_hint(err)}"
            ) from err

    def _put(
        self, manifest: str, key: str, value: object, meta: Mapping[str, Any], replace: bool
    ) -> bool:
        if not replace and self.fs.exists(manifest):
            return False
        chunks = serialize(value)
        hasher = hashlib.blake2b(digest_size=32)
        nbytes = 0
        for chunk in chunks:
            hasher.update(chunk)
            nbytes += len(chunk) if isinstance(chunk, bytes) else chunk.nbytes
        nonce = uuid.uuid4().hex
        payload_rel = f"data/{key}/{nonce}.bin"
        payload = f"{self.root}/{payload_rel}"
        for attempt in (1, 2):
            self.fs.makedirs(f"{self.root}/data/{key}", exist_ok=True)
            try:
                if self._local:
                    _write_new(payload, chunks)
                else:
                    with self.fs.open(payload, "wb") as f:
                        for chunk in chunks:
                            f.write(chunk)
                break
            except FileNotFoundError:  # gc removed the emptied directory just now
                if attempt == 2:
                    raise
        info = EntryInfo(
            key=key,
            stage=meta["stage"],
            params={str(k): _jsonable(v) for k, v in (meta["params"] or {}).items()},
            code_hash=meta["code_hash"],
            compute_seconds=float(meta["compute_seconds"]),
            nbytes=nbytes,
            created=time.time(),
            writer=_writer(),
            checksum="blake2b:" + hasher.hexdigest(),
            payload=payload_rel,
            ignored=meta["ignored"],
            max_age=meta["max_age"],
        )
        body = json.dumps(info.to_json(), indent=1, sort_keys=True).encode()
        won = self._commit(manifest, body, nonce, replace)
        if not won:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(payload)
        return won

    def delete(self, key: str) -> bool:
        """Remove an entry: its manifest first (so it stops being visible at once), then the
        payload the manifest names. Other payload files under the key (a concurrent writer's,
        or abandoned ones) are left for :meth:`gc`."""
        try:
            info, _ = self._manifest(key)
        except KeyError:
            return False
        return self._delete(key, info)

    def ls(self) -> list[EntryInfo]:
        """Manifests of all readable entries, oldest first (see :meth:`scan`)."""
        return self.scan()[0]

    def scan(self) -> tuple[list[EntryInfo], list[str]]:
        """Manifests of all sound-looking entries, oldest first, and the keys of those that look
        corrupt without reading a payload: a manifest that cannot be read, or a payload file
        that is missing or not the size the manifest records (one listing of the payloads).
        Nothing is removed (``verify`` removes them)."""
        manifests: list[EntryInfo] = []
        corrupt: list[str] = []
        for key in self.keys():
            try:
                info, _ = self._manifest(key)
            except KeyError:  # removed since the listing
                continue
            if info is None:
                corrupt.append(key)
            else:
                manifests.append(info)
        # Listed after the manifests: a committed manifest's payload was written before it.
        sizes = self._payload_sizes()
        out = []
        for info in manifests:
            if sizes.get(info.payload) == info.nbytes:
                out.append(info)
            else:
                corrupt.append(info.key)
        return sorted(out, key=lambda e: (e.created, e.key)), sorted(corrupt)

    def _payload_sizes(self) -> dict[str, int]:
        """``{"data/<key>/<name>.bin": size}`` of every payload file."""
        try:
            found = self.fs.find(f"{self.root}/data", detail=True)
        except FileNotFoundError:
            return {}
        out = {}
        for path, detail in found.items():
            rel = "/".join(str(path).rstrip("/").rsplit("/", 3)[-3:])
            size = detail.get("size")
            if isinstance(size, int):
                out[rel] = size
        return out

    def verify(self, keys: Iterable[str] | None = None, *, remove: bool = True) -> VerifyReport:
        """Re-read every entry (or ``keys``) and recompute its checksum.

        Corrupt entries are removed unless ``remove=False``; those that cannot be removed (a
        read-only store) are listed in :attr:`VerifyReport.not_removed`. Values are not
        unpickled.
        """
        ok, bad = [], []
        not_removed: dict[str, str] = {}
        for key in self.keys() if keys is None else keys:
            info, problem = self._check(key)
            if problem is None:
                ok.append(key)
                continue
            bad.append(key)
            if remove:
                failure = self._discard_corrupt(key, problem, info)
                if failure is not None:
                    not_removed[key] = failure
            else:
                logger.warning("daskjobs store %s: entry %s is corrupt: %s", self.url, key, problem)
        return VerifyReport(
            ok=tuple(ok), corrupt=tuple(bad), removed=remove, not_removed=not_removed
        )

    def gc(
        self,
        *,
        older_than: float | None = None,
        max_bytes: int | None = None,
        dry_run: bool = False,
        now: float | None = None,
    ) -> GCReport:
        """Remove expired entries (older than the ``max_age`` they were written with), entries
        created more than ``older_than`` seconds ago, then the oldest ones until the store
        holds at most ``max_bytes``; also removes abandoned uncommitted payloads and payloads
        replaced by a newer entry (older than an hour) and stale temporary files.

        ``dry_run`` reports and removes nothing. Entries that look corrupt (see :meth:`scan`)
        are left alone and not counted towards ``max_bytes``: a manifest claiming a huge size
        must not push sound entries out (``verify`` removes them). :class:`StoreAccessError` if
        the store cannot be written (after removing what it could).
        """
        now = time.time() if now is None else now
        entries, suspect = self.scan()
        reasons: dict[str, str] = {}
        for e in entries:
            if e.max_age is not None and e.expired(now):
                reasons[e.key] = f"expired (max_age {duration_text(e.max_age)})"
        if older_than is not None:
            for e in entries:
                if e.key not in reasons and now - e.created > older_than:
                    reasons[e.key] = f"older than {older_than:g}s"
        if max_bytes is not None:
            total = sum(e.nbytes for e in entries if e.key not in reasons)
            for e in entries:  # oldest first
                if total <= max_bytes:
                    break
                if e.key not in reasons:
                    reasons[e.key] = f"store above {max_bytes} bytes"
                    total -= e.nbytes
        removed = [e for e in entries if e.key in reasons]
        kept = [e for e in entries if e.key not in reasons]
        # Payloads of listed entries are not orphans (those of removed ones go with them);
        # an entry that looks corrupt keeps all its files until verify removes it.
        live = {e.key: e.payload for e in entries}
        live.update(dict.fromkeys(suspect, ""))
        orphans = self._orphans(now, live)
        if not dry_run:
            done = 0
            try:
                for e in removed:
                    self._delete(e.key, e)
                    done += 1
                for path in orphans:
                    with contextlib.suppress(FileNotFoundError):
                        self.fs.rm(path, recursive=True)
            except OSError as err:
                raise StoreAccessError(
                    f"cannot remove entries from the daskjobs store {self.url} "
                    f"({done} of {len(removed)} removed): {type(err).__name__}: {err}{_hint(err)}"
                ) from err
        return GCReport(
            removed=tuple(e.key for e in removed),
            freed_bytes=sum(e.nbytes for e in removed),
            kept=len(kept),
            kept_bytes=sum(e.nbytes for e in kept),
            orphans=len(orphans),
            dry_run=dry_run,
            reasons=reasons,
        )

    # -- internals --------------------------------------------------------------------------

    def _manifest(self, key: str) -> tuple[EntryInfo | None, str | None]:
        """The manifest of ``key``, or ``None`` and why it cannot be read; ``KeyError`` if there
        is none. Removes nothing."""
        path = self._manifest_path(key)
        try:
            raw = self.fs.cat_file(path)
        except (FileNotFoundError, NotADirectoryError):
            raise KeyError(key) from None
        try:
            info = EntryInfo.from_json(json.loads(raw))
        except (ValueError, KeyError, TypeError) as err:
            return None, f"unreadable manifest ({type(err).__name__}: {err})"
        if info.key != key:
            return None, f"manifest names key {info.key!r}"
        return info, None

    def _payload(self, info: EntryInfo) -> tuple[bytearray | None, str | None]:
        """The payload's bytes if they match the manifest, else ``None`` and the problem."""
        try:
            data, problem = self._read(f"{self.root}/{info.payload}", info.nbytes)
        except FileNotFoundError:
            return None, "payload missing"
        if data is not None and problem is None and _checksum(data) != info.checksum:
            problem = "checksum mismatch"
        return (data, None) if problem is None else (None, problem)

    def _read(self, path: str, expected: int) -> tuple[bytearray | None, str | None]:
        """Read a payload into a writable buffer (numpy arrays become views of it).

        Returns the buffer and a problem (``None`` if the size matches the manifest). The file's
        size is checked first, so a manifest claiming an absurd size allocates nothing.
        """
        size = self.fs.size(path)
        if size is None:  # a filesystem that does not know: read what is there
            data = bytearray(self.fs.cat_file(path))
            if len(data) != expected:
                return None, f"payload is {len(data)} bytes, its manifest records {expected}"
            return data, None
        if size < expected:
            return None, f"payload truncated: {size} of {expected} bytes"
        if size > expected:
            return None, f"payload longer ({size} bytes) than the {expected} its manifest records"
        buf = bytearray(expected)
        with self.fs.open(path, "rb") as f:
            n = f.readinto(buf) or 0
            longer = bool(f.read(1))
        if n < expected:
            return None, f"payload truncated: {n} of {expected} bytes"
        if longer:
            return None, f"payload longer than the {expected} bytes its manifest records"
        return buf, None

    def _check(self, key: str) -> tuple[EntryInfo | None, str | None]:
        """The manifest of ``key`` (if readable) and why the entry is corrupt (``None`` if it
        is sound). Removes nothing."""
        try:
            info, problem = self._manifest(key)
        except KeyError:
            return None, "manifest missing"
        if info is None:
            return None, problem
        return info, self._payload(info)[1]

    def _commit(self, manifest: str, body: bytes, nonce: str, replace: bool = False) -> bool:
        if self._local:
            tmp_dir = f"{self.root}/tmp"
            os.makedirs(tmp_dir, exist_ok=True)
            os.makedirs(os.path.dirname(manifest), exist_ok=True)
            tmp = f"{tmp_dir}/{nonce}.json"
            _write_new(tmp, [body])
            if replace:  # a rename over the old manifest: readers see one or the other
                try:
                    os.replace(tmp, manifest)
                except BaseException:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
                    raise
                return True
            try:
                os.link(tmp, manifest)  # atomic, and fails if the entry exists
                return True
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        tmp = f"{self.root}/tmp/{nonce}.json"
        self.fs.makedirs(f"{self.root}/tmp", exist_ok=True)
        self.fs.makedirs(f"{self.root}/entries", exist_ok=True)
        self.fs.pipe_file(tmp, body)
        try:
            if not replace and self.fs.exists(manifest):
                return False
            self.fs.copy(tmp, manifest)
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(tmp)

    def _delete(self, key: str, info: EntryInfo | None) -> bool:
        """Remove the manifest of ``key``, then the payload ``info`` names (if known)."""
        try:
            self.fs.rm_file(self._manifest_path(key))
            existed = True
        except FileNotFoundError:
            existed = False
        if info is not None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(f"{self.root}/{info.payload}")
            with contextlib.suppress(OSError):  # not empty: another writer's payload is there
                self.fs.rmdir(f"{self.root}/data/{key}")
        return existed

    def _discard_corrupt(self, key: str, reason: str, info: EntryInfo | None = None) -> str | None:
        """Remove a corrupt entry; ``None`` if done, else why it could not be (logged)."""
        try:
            self._delete(key, info)
        except OSError as err:
            failure = f"{type(err).__name__}: {err}{_hint(err)}"
            logger.warning(
                "daskjobs store %s: could not remove corrupt entry %s (%s): %s; "
                "it is left in place and read as a miss",
                self.url,
                key,
                reason,
                failure,
            )
            return failure
        logger.warning("daskjobs store %s: removed corrupt entry %s: %s", self.url, key, reason)
        return None

    def _orphans(self, now: float, live: Mapping[str, str]) -> list[str]:
        """Payload directories and files with no committed manifest, older than the grace."""
        out = []
        try:
            dirs = self.fs.ls(f"{self.root}/data", detail=False)
        except FileNotFoundError:
            dirs = []
        for d in dirs:
            key = str(d).rstrip("/").rsplit("/", 1)[-1]
            keep = live.get(key)
            for path in self._files(str(d)):
                if keep is not None and path.endswith(keep):
                    continue
                if now - self._mtime(path) > _ORPHAN_GRACE:
                    out.append(path)
        for path in self._files(f"{self.root}/tmp"):
            if now - self._mtime(path) > _ORPHAN_GRACE:
                out.append(path)
        return out

    def _files(self, path: str) -> Iterator[str]:
        try:
            yield from (str(p) for p in self.fs.find(path))
        except FileNotFoundError:
            return

    def _mtime(self, path: str) -> float:
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return time.time()
        for field_name in ("mtime", "created", "LastModified", "last_modified"):
            value = info.get(field_name)
            if isinstance(value, (int, float)):
                return float(value)
            if hasattr(value, "timestamp"):
                return float(value.timestamp())
        return 0.0


#: Mode of the files a local store creates (umask permitting): the writer and its group
#: read them (a team shares a store), others do not.
FILE_MODE = 0o640


def _write_new(path: str, chunks: Iterable[Any]) -> None:
    """Write a new local file (its name carries a nonce): created ``FILE_MODE``, never
    over an existing file and never through a symbolic link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    with os.fdopen(fd, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
