"""Packaging: metadata, declared dependencies, the version, the typed public API, the
dask version check, and a wheel of this checkout installed into a fresh environment
running a real cluster.

The last test is what a user does: ``pip install .`` (a wheel built from the checkout)
into a new virtual environment, then ``dask scheduler --preload daskjobs.preload`` and
two ``dask worker`` processes from *that* environment run a sweep with the plugin
active, and ``dask jobs status ADDRESS`` answers. It reuses pip's cache; the first run
on a machine downloads dask, distributed and the other dependencies.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from importlib.metadata import distribution, packages_distributions
from pathlib import Path
from typing import Any

import pytest
from repo import FOLDERS, ROOT

import daskjobs
from daskjobs.plugin.surgery import _internals

PACKAGE = ROOT / "daskjobs"
BIN = Path(sys.executable).parent

#: Imports allowed outside the base dependencies: module -> the extra that declares it.
#: Each is imported only inside the function that needs it, and says so when missing.
OPTIONAL = {
    "matplotlib": "plot",
    "prometheus_client": "metrics",
    "psycopg": "postgres",
    "bokeh": "dashboard",
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements() -> dict[str | None, set[str]]:
    """Declared requirements of the installed daskjobs: extra (None: base) -> names."""
    out: dict[str | None, set[str]] = {}
    for req in distribution("daskjobs").requires or []:
        name = canonical(re.match(r"[A-Za-z0-9._-]+", req).group())  # type: ignore[union-attr]
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", req)
        out.setdefault(extra.group(1) if extra else None, set()).add(name)
    return out


@functools.cache
def third_party_imports() -> dict[str, dict[str, list[str]]]:
    """Top-level module names imported by daskjobs/ (not stdlib, not daskjobs), each with
    where it is imported at module level ("module") and elsewhere ("deferred"): in a
    function, or under ``if TYPE_CHECKING:`` (which never runs). One walk of each module
    (the scan is made once: two tests read it)."""
    found: dict[str, dict[str, list[str]]] = {}

    def visit(node: ast.AST, deferred: bool, path: Path) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and not child.level and child.module:
                names = [child.module]
            else:
                names = []
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("daskjobs", "__future__"):
                    continue
                where = "deferred" if deferred else "module"
                rel = f"{path.relative_to(ROOT)}:{child.lineno}"
                found.setdefault(top, {"module": [], "deferred": []})[where].append(rel)
            inside = (
                deferred
                or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
            )
            visit(child, inside, path)

    for path in sorted(PACKAGE.rglob("*.py")):
        visit(ast.parse(path.read_text(encoding="utf-8")), False, path)
    return found


# -- metadata -----------------------------------------------------------------------------


def test_version_is_the_installed_distribution_s_and_the_source_s() -> None:
    from daskjobs._version import __version__ as source

    assert daskjobs.__version__ == distribution("daskjobs").version == source


def test_the_version_falls_back_to_the_source_string_when_not_installed(tmp_path: Path) -> None:
    # a copy of the package with no distribution metadata anywhere on its path (-S: no site)
    shutil.copytree(PACKAGE, tmp_path / "daskjobs", ignore=shutil.ignore_patterns("__pycache__"))
    script = "import daskjobs, daskjobs._version as v; print(daskjobs.__version__, v.__version__)"
    run = subprocess.run(
        [sys.executable, "-S", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert run.returncode == 0, run.stderr
    got, source = run.stdout.split()
    assert got == source == daskjobs.__version__


def test_import_daskjobs_stays_cheap() -> None:
    script = (
        "import sys; before = set(sys.modules); import daskjobs; "
        "print(','.join(sorted(m for m in set(sys.modules) - before "
        "if m.split('.')[0] in ('dask', 'distributed', 'numpy', 'yaml', 'importlib') "
        "or m.startswith('daskjobs.'))))"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "", run.stdout


def test_metadata_is_complete_and_truthful() -> None:
    meta = distribution("daskjobs").metadata
    assert meta["Name"] == "daskjobs" and meta["Summary"]
    assert meta["License-Expression"] == "BSD-3-Clause"
    classifiers = meta.get_all("Classifier") or []
    assert "Development Status :: 3 - Alpha" in classifiers
    assert "Typing :: Typed" in classifiers and "Framework :: Dask" in classifiers
    # every Python version claimed is allowed by Requires-Python, and this one is claimed
    lowest = tuple(int(x) for x in meta["Requires-Python"].removeprefix(">=").split("."))
    claimed = [
        tuple(int(x) for x in c.rsplit(" ", 1)[1].split("."))
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert claimed and min(claimed) == lowest, (claimed, lowest)
    assert sys.version_info[:2] in claimed
    # no invented addresses: any URL given is a real one, none is a placeholder
    for url in meta.get_all("Project-URL") or []:
        assert not re.search(r"example\.|TODO|your-|<|>", url), url


def test_entry_points_declare_the_command_and_dask_jobs() -> None:
    eps = {(ep.group, ep.name): ep.value for ep in distribution("daskjobs").entry_points}
    assert eps[("console_scripts", "daskjobs")] == "daskjobs.cli:main"
    assert eps[("dask_cli", "jobs")] == "daskjobs.cli:jobs"


@pytest.mark.slow
def test_every_third_party_import_is_a_declared_dependency() -> None:
    declared = requirements()
    base = declared[None]
    dists = packages_distributions()
    problems = []
    for module, where in sorted(third_party_imports().items()):
        names = {canonical(d) for d in dists.get(module, [module])}
        if module in OPTIONAL:
            extra = OPTIONAL[module]
            if not names & declared.get(extra, set()):
                problems.append(f"{module}: not declared in the [{extra}] extra")
            if where["module"]:
                problems.append(f"{module} (optional) imported at module level: {where['module']}")
        elif not names & base:
            problems.append(f"{module}: imported at {where['module'] + where['deferred']}")
    assert not problems, "undeclared dependencies:\n" + "\n".join(problems)


@pytest.mark.slow
def test_the_scan_finds_what_the_issue_found() -> None:
    # PyYAML was imported (daskjobs/_defaults.py) and not declared: the scan sees it
    found = third_party_imports()
    assert "daskjobs/_defaults.py" in " ".join(found["yaml"]["module"])
    assert "pyyaml" in requirements()[None]


# -- dask versions ------------------------------------------------------------------------


def test_the_lowest_supported_release_is_the_declared_lower_bound() -> None:
    lowest = _internals.LOWEST_SUPPORTED
    base = [r for r in distribution("daskjobs").requires or [] if "extra" not in r]
    for name in ("dask", "distributed"):
        (req,) = [r for r in base if re.match(rf"{name}\b", r)]
        assert req == f"{name}>={lowest}", f"{req}: no upper bound, lower bound {lowest}"
    assert "LOWEST_SUPPORTED" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize(
    ("dask_version", "distributed_version", "problems"),
    [
        (_internals.LOWEST_SUPPORTED, _internals.LOWEST_SUPPORTED, []),
        ("2999.1.0", "2999.1.0+3.gabc1234", []),
        ("2999.1.0.dev3", "2999.1.0", []),
        ("2024.11.2", "2024.11.2", ["dask 2024.11.2", "distributed 2024.11.2"]),
        (_internals.LOWEST_SUPPORTED, "2024.11.2", ["distributed 2024.11.2"]),
    ],
)
def test_check_versions(dask_version: str, distributed_version: str, problems: list[str]) -> None:
    got = _internals.check_versions(dask_version, distributed_version)
    assert [p.rsplit(" is older", 1)[0] for p in got] == problems
    assert all(p.endswith(f"is older than {_internals.LOWEST_SUPPORTED}") for p in got)


def test_an_old_distributed_is_refused_naming_both_versions(monkeypatch: Any) -> None:
    import dask
    import distributed
    from distributed import Scheduler

    monkeypatch.setattr(distributed, "__version__", "2024.11.2")
    monkeypatch.setattr(dask, "__version__", "2024.11.2")
    with pytest.raises(_internals.DaskInternalsError) as err:
        _internals.check_scheduler(Scheduler.__new__(Scheduler))
    msg = str(err.value)
    assert "cannot run on distributed 2024.11.2 (dask 2024.11.2)" in msg
    assert f"supports dask and distributed {_internals.LOWEST_SUPPORTED} and newer" in msg
    assert f"install dask and distributed {_internals.LOWEST_SUPPORTED} or newer" in msg


def test_a_newer_release_missing_a_piece_is_named_as_such() -> None:
    import distributed

    class Changed:  # a scheduler of this release without most of what the plugin uses
        def __init__(self) -> None:
            self.tasks: dict[str, Any] = {}

    with pytest.raises(_internals.DaskInternalsError) as err:
        _internals.check_scheduler(Changed())
    msg = str(err.value)
    assert f"cannot run on distributed {distributed.__version__}" in msg
    assert "missing Scheduler._set_priorities" in msg and "Scheduler.tasks" not in msg
    assert "please report it" in msg and _internals.LOWEST_SUPPORTED in msg


# -- the typed public API -----------------------------------------------------------------


def test_the_stub_and_the_lazy_table_agree() -> None:
    stub = ast.parse((PACKAGE / "__init__.pyi").read_text(encoding="utf-8"))
    typed = {
        alias.asname: node.module
        for node in stub.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    imports = [n for n in stub.body if isinstance(n, ast.ImportFrom)]
    assert all(alias.asname == alias.name for n in imports for alias in n.names)  # re-exports
    assert typed == daskjobs._LAZY
    for name in daskjobs._LAZY:
        assert name in dir(daskjobs) and name in daskjobs.__all__
        assert getattr(daskjobs, name) is not None


def test_the_jobs_stub_and_its_lazy_table_agree() -> None:
    """daskjobs.jobs imports what needs distributed on first use: its stub names every
    public name, from the module its table (or its eager imports) takes it from."""
    import subprocess
    import sys

    import daskjobs.jobs as jobs

    stub = ast.parse((PACKAGE / "jobs" / "__init__.pyi").read_text(encoding="utf-8"))
    typed = {
        alias.asname: (node.module, alias.name)
        for node in stub.body
        if isinstance(node, ast.ImportFrom) and node.module != "builtins"
        for alias in node.names
    }
    aliases = {
        t.id: v.id
        for n in stub.body
        if isinstance(n, ast.Assign) and isinstance(v := n.value, ast.Name)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    for name, original in aliases.items():  # ``list = list_jobs``
        typed[name] = typed[original]
    assert sorted(typed) == sorted(jobs.__all__)
    for name, where in jobs._LAZY.items():
        assert typed[name] == where, name
    for name in jobs.__all__:
        got = getattr(jobs, name)
        module, original = typed[name]
        assert got is getattr(__import__(module, fromlist=[original]), original), name
    # reading a ledger loads neither dask nor distributed
    code = "import sys, daskjobs.jobs; print('distributed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


MYPY_SNIPPET = """\
import daskjobs

reveal_type(daskjobs.Sweep)
reveal_type(daskjobs.__version__)
reveal_type(daskjobs.ResultStore)
sweep: daskjobs.Sweep = daskjobs.Sweep("s", team=3)
daskjobs.grid(x=[1, 2]).nope
"""

MYPY_CONFIG = """\
[mypy]
ignore_missing_imports = True
follow_imports = silent
cache_dir = {cache}
[mypy-distributed.*,dask.*,numpy.*,tornado.*,fsspec.*,click.*,sqlalchemy.*,bokeh.*]
follow_imports = skip
"""


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for this file's mypy runs: the second reuses what the first
    analysed (the standard library, typeshed, daskjobs' modules: a fifth of a cold run's
    time is left). A module's entry is reused only where its file's content hash is the
    same, wherever the file is (the checkout, the fresh environment), and a module mypy
    cannot find is missing however warm the cache (a wheel without py.typed fails both
    ways)."""
    return tmp_path_factory.mktemp("mypy") / ".mypy_cache"


def run_mypy(tmp_path: Path, cache: Path, *args: str, env: dict[str, str] | None = None) -> str:
    (tmp_path / "snippet.py").write_text(MYPY_SNIPPET)
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG.format(cache=cache))
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", *args, "snippet.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert run.returncode == 1, run.stdout + run.stderr  # the two misuses
    return run.stdout


def check_mypy_output(out: str) -> None:
    sweep = "def (name: str =, *, team: str | None =) -> daskjobs.sweep.stages.Sweep"
    assert f'snippet.py:3: note: Revealed type is "{sweep}"' in out, out
    assert 'snippet.py:4: note: Revealed type is "str"' in out, out
    assert "daskjobs.cache.store.ResultStore" in out, out
    assert 'Argument "team" to "Sweep" has incompatible type "int"' in out, out
    assert '"Grid" has no attribute "nope"' in out, out
    assert "Found 2 errors in 1 file" in out, out


@pytest.mark.slow
def test_mypy_sees_the_public_api_s_types(tmp_path: Path, mypy_cache: Path) -> None:
    # the source tree (mypy does not follow the import hook of an editable install)
    out = run_mypy(tmp_path, mypy_cache, env={**os.environ, "MYPYPATH": str(ROOT)})
    check_mypy_output(out)


# -- pip install . into a fresh environment -----------------------------------------------


def clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH: nothing inherited may put a source tree of
    daskjobs ahead of (or, for pip, in place of) the installed one."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A new virtual environment with a wheel of this checkout installed: (its bin
    directory, the wheel). The wheel is built from a copy of what it is made of, so no
    build/ directory is left in the checkout."""
    tmp = tmp_path_factory.mktemp("fresh")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(PACKAGE, src / "daskjobs", ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp / "venv"
    # no pip of its own (ensurepip took 4.5 of the venv's 4.7 s): this interpreter's pip
    # installs into it (``pip --python``), as the venv's own pip would
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = str(venv / "bin" / "python")
    env = clean_env()

    def pip(*args: str) -> None:
        run = subprocess.run(
            [sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check", *args],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    pip("wheel", "--no-deps", "-w", str(tmp / "dist"), str(src))
    (wheel,) = (tmp / "dist").glob("daskjobs-*.whl")
    # --no-compile: pip's byte-compiling of every installed module was half of the install
    # (17 s against 9 s without, at a load of 4); the processes compile what they import
    pip("install", "--no-compile", str(wheel))
    yield venv / "bin", wheel


@pytest.mark.slow
@pytest.mark.realcluster
def test_pip_install_then_a_real_cluster_runs_a_sweep_with_the_plugin(
    fresh_venv: tuple[Path, Path], real_cluster: Any, tmp_path: Path
) -> None:
    from daskjobs.examples import build_sweep

    bin_dir, wheel = fresh_venv
    venv = bin_dir.parent
    env = clean_env()
    # the wheel holds the package data, the stub and both entry points
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for member in ("py.typed", "__init__.pyi", "daskjobs.yaml", "preload.py", "_version.py"):
            assert f"daskjobs/{member}" in names, member
        (eps,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "[dask_cli]\njobs = daskjobs.cli:jobs" in zf.read(eps).decode()
    # the installed version is the package's
    probe = subprocess.run(
        [
            str(bin_dir / "python"),
            "-c",
            "import daskjobs, importlib.metadata as m; "
            "print(daskjobs.__version__, m.version('daskjobs'), daskjobs.__file__)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env=env,
    )
    assert probe.returncode == 0, probe.stderr
    version, meta_version, where = probe.stdout.split()
    assert version == meta_version == daskjobs.__version__
    assert where.startswith(str(venv))

    rc = real_cluster(
        n_workers=2,
        nthreads=1,
        preload="daskjobs.preload",
        bin_dir=bin_dir,
        source_on_path=False,
        env={"PYTHONPATH": os.pathsep.join(map(str, FOLDERS))},
    )
    with rc.client() as c:
        # scheduler and workers run the installed daskjobs, with the plugin on the scheduler
        files = c.run(lambda: __import__("daskjobs").__file__)
        assert len(files) == 2 and all(f.startswith(str(venv)) for f in files.values()), files
        on_scheduler = c.run_on_scheduler(
            lambda dask_scheduler: (
                __import__("daskjobs").__file__,
                type(dask_scheduler.plugins.get("daskjobs")).__name__,
            )
        )
        assert on_scheduler[0].startswith(str(venv)) and on_scheduler[1] == "JobsPlugin"
        sweep = build_sweep(slices=2, bars=500, fast=[5, 10], slow=[20, 40], costs=[1.0])
        result = sweep.run(c, store=False, progress=False)
        assert not result.failures
        st = daskjobs.status(c)
    assert st["ranked_graphs"] >= 1 and st["errors"] == {}, st
    assert st["tasks"] >= 2 + 2 + 8 or st["stages"], st
    run = subprocess.run(
        [str(bin_dir / "dask"), "jobs", "status", rc.address],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"scheduler {rc.address}\npolicy "), run.stdout
    assert rc.problems() == []


@pytest.mark.slow
def test_mypy_sees_the_installed_wheel_s_types(
    fresh_venv: tuple[Path, Path], tmp_path: Path, mypy_cache: Path
) -> None:
    bin_dir, _ = fresh_venv
    # clean_env: an inherited PYTHONPATH put the checkout on the environment's path, where
    # mypy found daskjobs (with its py.typed) ahead of the wheel's
    out = run_mypy(
        tmp_path, mypy_cache, "--python-executable", str(bin_dir / "python"), env=clean_env()
    )
    check_mypy_output(out)
