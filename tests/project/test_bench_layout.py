"""benchmarks/ as code: no imports between tests/ and benchmarks/, no file over 500 lines,
every benchmark on the shared command line (``--quick``, ``--markdown``, ``--plot``).

Benchmarks are scripts, not tests; what both need lives in the package (e.g.
:mod:`daskjobs.timeline`). An AST scan of every module on each side, imports inside
functions included, and of the calls that put a directory on ``sys.path`` or load a file
by path. Benchmarks start real ``dask scheduler``/``dask worker`` processes through one
door, ``benchmarks/harness/processes.py``, which reaches the test suite's real-process
harness (``tests/helpers/realcluster.py``) until that harness moves into the package.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from repo import FOLDERS, ROOT

TESTS = ROOT / "tests"
BENCHMARKS = ROOT / "benchmarks"

#: The one module of benchmarks/ that may reach tests/ (see the module docstring).
DOOR = "harness/processes.py"
#: Benchmark files owned by other work today, each with what it still does; the test
#: below fails once one no longer does it, so the list only shrinks.
PENDING_IMPORTS: dict[str, str] = {}
PENDING_CLI: dict[str, str] = {}
#: Calls that put a directory on the path or load a module from a file.
PATH_CALLS = (
    "path.insert",
    "path.append",
    "run_path",
    "spec_from_file_location",
    "SourceFileLoader",
)


def modules_in(directory: Path) -> set[str]:
    """Top-level names importable from ``directory``: its modules and packages."""
    names = {p.stem for p in directory.glob("*.py")}
    names |= {p.parent.name for p in directory.glob("*/__init__.py")}
    return names


def python_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*.py") if "__pycache__" not in p.parts)


def offences(path: Path, names: set[str], directory: str) -> list[str]:
    """Imports of ``names`` in ``path``, and path calls that mention ``directory``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            tops = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            tops = [node.module.split(".")[0]]
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith(PATH_CALLS):
            text = ast.unparse(node)
            if f"'{directory}'" in text or f'"{directory}"' in text:
                found.append(f"{where}:{node.lineno}: {text}")
            continue
        else:
            continue
        for top in tops:
            if top in names or top == directory:
                found.append(f"{where}:{node.lineno}: import {top}")
    return found


def test_the_scan_finds_both_kinds_of_offence(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import sys\n"
        "sys.path.insert(0, str(ROOT / 'benchmarks'))\n"
        "def f():\n"
        "    from bench_speculation import Case\n"
        "    import harness.machine\n"
    )
    got = offences(bad, {"bench_speculation", "harness"}, "benchmarks")
    assert len(got) == 3, got
    good = tmp_path / "good.py"
    good.write_text("import daskjobs.timeline\nfrom pathlib import Path\nPath('benchmarks')\n")
    assert offences(good, {"bench_speculation", "harness"}, "benchmarks") == []


@pytest.mark.slow
def test_tests_import_nothing_from_benchmarks() -> None:
    names = modules_in(BENCHMARKS)
    assert {"bench_speculation", "harness", "speculation"} <= names
    found = []
    for path in python_files(TESTS):
        if path.name != Path(__file__).name:  # this file names them on purpose
            found += offences(path, names, "benchmarks")
    assert not found, "tests/ imports from benchmarks/:\n" + "\n".join(found)


def test_benchmarks_import_nothing_from_tests_but_through_their_door() -> None:
    names = set().union(*map(modules_in, FOLDERS)) - modules_in(BENCHMARKS)
    assert {"realcluster", "realtasks", "conftest"} <= names
    found = []
    for path in python_files(BENCHMARKS):
        rel = path.relative_to(BENCHMARKS).as_posix()
        if rel == DOOR or rel in PENDING_IMPORTS:
            continue
        found += offences(path, names, "tests")
    assert not found, "benchmarks/ imports from tests/:\n" + "\n".join(found)


def test_pending_files_are_still_pending() -> None:
    names = set().union(*map(modules_in, FOLDERS)) - modules_in(BENCHMARKS)
    for rel in PENDING_IMPORTS:
        path = BENCHMARKS / rel
        assert path.exists() and offences(path, names, "tests"), (
            f"benchmarks/{rel} no longer imports tests/: drop it from PENDING_IMPORTS"
        )


def test_no_benchmark_file_is_over_500_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in python_files(BENCHMARKS)
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500
    }
    assert not long, long


_HELP = """
import contextlib, io, json, runpy, sys
sys.path.insert(0, sys.argv[1])
out = {}
for path in sys.argv[2:]:
    sys.argv = [path, "--help"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit:
            pass
    out[path.rsplit("/", 1)[-1]] = buf.getvalue()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_every_benchmark_takes_the_common_options() -> None:
    scripts = sorted(BENCHMARKS.glob("bench_*.py"))
    assert len(scripts) >= 10
    run = subprocess.run(
        [sys.executable, "-c", _HELP, str(BENCHMARKS), *map(str, scripts)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    helps = json.loads(run.stdout.strip().splitlines()[-1])
    assert sorted(helps) == [p.name for p in scripts]
    for name, text in helps.items():
        has = all(opt in text for opt in ("--quick", "--markdown", "--plot"))
        if name in PENDING_CLI:
            assert not has, f"{name} takes the common options now: drop it from PENDING_CLI"
        else:
            assert has, f"{name} --help lacks --quick, --markdown or --plot:\n{text}"
        assert not required(text), (
            f"{name} needs {required(text)}: `python benchmarks/{name} --quick` must run alone"
        )


def required(help_text: str) -> list[str]:
    """The arguments a script's usage line asks for outside ``[...]``: those without which
    ``--quick`` alone does not run."""
    usage = help_text.split("\n\n")[0].split(None, 2)[2:]  # after "usage: NAME"
    rest = " ".join(usage)
    while (shorter := re.sub(r"\[[^\[\]]*\]", "", rest)) != rest:
        rest = shorter
    return rest.split()


def test_required_reads_a_usage_line() -> None:
    assert required("usage: a.py [-h] [--quick] [--size {1,2}]\n\noptions: ...") == []
    assert required("usage: a.py [-h] [--quick]\n   [--plot PATH] --against DIR\n\nx") == [
        "--against",
        "DIR",
    ]


@pytest.mark.slow
def test_a_quick_run_prints_and_writes_its_figures(tmp_path: Path) -> None:
    # the simulator experiment of bench_speculation: the harness end to end, no cluster
    md, png = tmp_path / "figures.md", tmp_path / "figures.png"
    run = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_speculation.py",
            "--model",
            "0,800",
            "--quick",
            "--markdown",
            str(md),
            "--plot",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    body = md.read_text()
    assert body in run.stdout  # the page includes what the run printed
    assert "- command: `python benchmarks/bench_speculation.py --model 0,800 --quick`" in body
    assert "- machine: " in body and "sum(range(10**7))" in body
    rows = [line for line in body.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| dispatch capacity") and len(rows) == 3  # header + 2 rates
    assert rows[1].startswith("| unlimited |") and rows[2].startswith("| 800 |")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


#: The benchmarks page: each plot with the command that drew it, right under it.
PAGE = ROOT / "docs" / "benchmarks.md"
#: Sections of the page without a plot, and why.
NO_PLOT = {"Faults": "its figures are what happened and what the user saw: words, on reliability"}


def test_every_plot_on_the_benchmarks_page_comes_with_its_command() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert len(text.encode()) < 30_000, f"docs/benchmarks.md is {len(text.encode()):,} bytes"
    lines = text.splitlines()
    plots = [(n, m) for n, line in enumerate(lines) if (m := re.match(r"!\[.+\]\((.+)\)$", line))]
    drawn = set()
    for n, m in plots:
        image = PAGE.parent / m.group(1)
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{m.group(1)} is not a PNG"
        after = " ".join(lines[n + 1 : n + 4])
        cmd = re.search(r"`(python benchmarks/(bench_\w+\.py)[^`]*)`", after)
        assert cmd, f"line {n + 1}: the plot {m.group(1)} has no command under it"
        assert f"--plot docs/{m.group(1)}" in cmd.group(1), (
            f"line {n + 1}: the command under {m.group(1)} does not write it: {cmd.group(1)}"
        )
        assert (BENCHMARKS / cmd.group(2)).exists(), cmd.group(2)
        drawn.add(n)
    sections = [n for n, line in enumerate(lines) if line.startswith("## ")]
    for k, start in enumerate(sections):
        end = sections[k + 1] if k + 1 < len(sections) else len(lines)
        title = lines[start][3:].strip()
        if title not in NO_PLOT:
            assert any(start < n < end for n in drawn), f"section {title!r} has no plot"
    assert "<!-- plot:" not in text, "a plot is still a placeholder"


def tables_without_a_command(text: str) -> list[str]:
    """The tables of a page with no command (`` `python benchmarks/...` `` or
    `` `daskjobs ...` ``) between them and the heading above them: their first lines."""
    lines = text.splitlines()
    out = []
    for n, line in enumerate(lines):
        if line.startswith("| ") and not (n and lines[n - 1].startswith("|")):
            start = max(k for k in range(n + 1) if k == 0 or lines[k].startswith("#"))
            above = "\n".join(lines[start:n])
            if "`python benchmarks/" not in above and "`daskjobs " not in above:
                out.append(f"line {n + 1}: {line[:60]}")
    return out


def test_every_table_on_the_benchmarks_page_has_its_command_in_its_section() -> None:
    sample = "## A\n\n`python benchmarks/bench_a.py`\n\n| x |\n|---|\n\n### B\n\n| y |\n|---|\n"
    assert tables_without_a_command(sample) == ["line 10: | y |"]
    found = tables_without_a_command(PAGE.read_text(encoding="utf-8"))
    assert not found, "tables on docs/benchmarks.md without their command:\n" + "\n".join(found)
