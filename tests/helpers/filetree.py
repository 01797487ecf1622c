"""Files under a folder in a test: made read-only for every process, and read back whole."""

from __future__ import annotations

import contextlib
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path


def _writable(directory: Path) -> bool:
    probe = directory / f".probe-{uuid.uuid4().hex}"
    try:
        probe.write_bytes(b"")
    except OSError:
        return False
    probe.unlink()
    return True


@contextlib.contextmanager
def read_only(root: Path) -> Iterator[None]:
    """Make the tree under ``root`` read-only for every process, root included.

    Permission bits are enough for an ordinary user; root ignores them, so as root the
    tree is also made immutable (``chattr +i``), which binds root too.
    """
    paths = [root, *root.rglob("*")]
    modes = {p: p.stat().st_mode for p in paths}
    for p in paths:
        p.chmod(stat.S_IMODE(modes[p]) & ~0o222)
    immutable = False
    try:
        if _writable(root):
            subprocess.run(["chattr", "-R", "+i", str(root)], check=True)
            immutable = True
        assert not _writable(root), f"could not make {root} read-only"
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-R", "-i", str(root)], check=True)
        for p in paths:
            p.chmod(stat.S_IMODE(modes[p]))


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
