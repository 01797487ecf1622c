"""Where things are, for the tests and the processes they start.

The tests live in a folder per area of the package (tests/plugin/, tests/sim/, ...), real
processes and network namespaces apart (tests/real/, tests/network/), and the modules they
share in tests/helpers/ (this one among them); docs/how-to/develop.md has the map. None of
these folders is a package: a module imports by its name (``import realtasks``,
``from realcluster import RealCluster``), in pytest's process (tests/conftest.py puts
:data:`FOLDERS` on ``sys.path``) and in every ``dask scheduler``/``dask worker`` it starts
(tests/helpers/realcluster.py puts them on their ``PYTHONPATH``), where functions pickled from
a test module or a helper are imported by name. So two modules under tests/ never share a
name (pytest, which imports a test module by its name too, refuses a second one), and no
folder of tests/ has a conftest.py of its own: the test modules import tests/conftest.py by
name (``from conftest import plugin_cluster``).
"""

from __future__ import annotations

from pathlib import Path

#: The checkout: the first folder above this file that holds pyproject.toml.
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
TESTS = ROOT / "tests"
#: The modules the tests share (this one among them).
HELPERS = Path(__file__).resolve().parent


def _folders() -> list[Path]:
    """The helpers first, then tests/ and each folder of it, in name order."""
    found = [HELPERS, TESTS]
    found += sorted(p for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    return list(dict.fromkeys(found))


#: The folders whose modules import by name.
FOLDERS = _folders()
