"""Every Python block and shell command of README.md and of every page under docs/ runs here.

Our own extractor, not a plugin: pytest-markdown-docs and phmdoctest run Python blocks only, and
the documentation is as much shell commands (``daskjobs simulate ...``, ``daskjobs replay ...``)
as Python; both also run the blocks inside pytest's process, where a policy a page registers or a
cluster it starts would leak into the other tests.

What runs, and how
------------------
* A fenced block is run if its language is ``python``, ``bash`` or ``console``; ``text``,
  ``json``, ``yaml``, ``toml`` and unlabelled blocks are output, samples and file contents, and
  are never run. Blocks indented in a list item are dedented first.
* Each page runs in a fresh Python process (``python tests/docs/test_docs.py PAGE.json``), in its
  own temporary working directory holding links to the checkout's top-level folders (so
  ``examples/...`` resolves as it does in a checkout) and nothing else: a store, a trace or a file
  a block writes lands there. ``DASK_*`` and ``DASKJOBS_*`` variables are removed from the
  environment; matplotlib draws with ``Agg``; the user cache directory (``XDG_CACHE_HOME``,
  where the plugin keeps measured durations by default) is the page's own, empty at its start.
* The Python blocks of a page share one namespace, in page order, as cells of a notebook do; the
  shell blocks of the page run between them, in page order. Clients and clusters a page leaves
  open are closed at its end.
* ``bash`` blocks run as one script under ``set -euo pipefail``; a block whose last line is
  ``cd DIR`` (alone or after ``&&``) moves the page there, as it would a reader's terminal: the
  blocks after it, shell and Python, run in DIR. In ``console`` blocks each
  ``$ command`` runs and the lines after it, up to the next ``$``, are its expected output.
* ``pip install`` is checked, not run: the test's environment is the installed one (``.ci/run``
  installs it on a clean machine), so a ``pip`` first on the ``PATH`` checks that the project or
  ``daskjobs[extras]`` named is installed here with every requirement of those extras, and fails
  otherwise.
* A shared cluster's address, ``tcp://scheduler:8786``, is replaced by the address of a
  ``LocalCluster`` (plain dask, 2 workers x 2 threads, tcp) that the page's process starts,
  in Python blocks, shell commands and expected output alike.

Output
------
A ``text`` block directly after a Python block is that block's expected standard output; a
``console`` command's expected output is the lines after it. Both are compared with the output
of the run, line by line, trailing spaces ignored; ``...`` alone on a line stands for any number
of lines, and inside a line for any text (as doctest's ELLIPSIS).

Marks
-----
An HTML comment on the line before a fence says how to treat it; every mark that skips something
carries its reason, and the skips are kept few (:data:`MAX_SKIPS`):

* ``<!-- no-run: REASON -->``: the block is not run (it needs a real shared cluster, it runs this
  test suite, it starts a server that runs until stopped).
* ``<!-- no-compare: REASON -->``: the block runs, its shown output is not compared (a sample of a
  busy cluster).
* ``<!-- file: NAME.py -->``: the Python block is the file NAME.py of the reader's project: it is
  written into the working directory and imported as a module, as the text around it says.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

#: The checkout (this file also runs as a script, a page's process, where tests/helpers/repo.py
#: is not on the path)
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

RUN = {"python", "bash", "console"}
NOT_RUN = {"", "text", "json", "yaml", "toml"}
MARKS = {"no-run", "no-compare", "file"}
#: How many blocks may be marked no-run or no-compare, over all pages.
MAX_SKIPS = 8
#: A shared cluster's address in the docs, replaced by one the page's process starts.
SHARED = "tcp://scheduler:8786"
#: Seconds one shell command may take.
COMMAND_TIMEOUT = 240

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)(?P<info>[^`\n]*)$")
_MARK = re.compile(r"^\s*<!--\s*(?P<name>[a-z-]+)\s*:\s*(?P<value>.*?)\s*-->\s*$")


@dataclass
class Block:
    page: str  # relative to the checkout
    line: int  # of the first code line, 1-based
    lang: str
    code: str
    marks: dict[str, str] = field(default_factory=dict)
    expected: str | None = None  # a Python block's output block, if one follows it

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def parse(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of a markdown file, with their marks and expected output."""
    lines = path.read_text().splitlines()
    page = str(path.relative_to(root))
    blocks: list[Block] = []
    i = 0
    last_end = -1  # the closing fence line of the previous block
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = m["indent"], m["fence"]
        lang = m["info"].strip().split(" ")[0].lower() if m["info"].strip() else ""
        j = i + 1
        while j < len(lines) and not (
            lines[j].strip().startswith(fence) and lines[j].strip().strip(fence[0]) == ""
        ):
            j += 1
        body = [
            ln[len(indent) :] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1 : j]
        ]
        code = "\n".join(body) + "\n"
        marks: dict[str, str] = {}
        k = i - 1
        while k >= 0 and _MARK.match(lines[k]):
            mark = _MARK.match(lines[k])
            assert mark is not None
            marks[mark["name"]] = mark["value"]
            k -= 1
        block = Block(page, i + 2, lang, code, marks)
        gap = lines[last_end + 1 : i] if blocks else []
        prev = blocks[-1] if blocks else None
        if (
            lang == "text"
            and prev is not None
            and prev.lang == "python"
            and last_end >= 0
            and all(not g.strip() for g in gap)
        ):
            prev.expected = code
        blocks.append(block)
        last_end = j
        i = j + 1
    return blocks


# -- comparing output ---------------------------------------------------------------------------


def _normalise(text: str) -> list[str]:
    out = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    while out and not out[-1]:
        out.pop()
    while out and not out[0]:
        out.pop(0)
    return out


def matches(expected: str, actual: str) -> bool:
    """``actual`` as ``expected`` shows it: ``...`` is any lines alone, any text in a line."""
    pattern = ""
    for line in _normalise(expected):
        if line.strip() == "...":
            pattern += r"(?:[^\n]*\n)*?"
        else:
            pattern += r"[^\n]*".join(re.escape(part) for part in line.split("...")) + r"\n"
    text = "".join(f"{ln}\n" for ln in _normalise(actual))
    return re.fullmatch(pattern, text) is not None


def _diff(expected: str, actual: str) -> str:
    import difflib

    return "\n".join(
        difflib.unified_diff(
            _normalise(expected), _normalise(actual), "shown", "printed", lineterm=""
        )
    )


# -- the page's process -------------------------------------------------------------------------

PIP_SHIM = '''\
import re, sys
from pathlib import Path

def fail(msg):
    print(f"pip (docs test): {msg}", file=sys.stderr)
    sys.exit(1)

args = sys.argv[1:]
if not args or args[0] != "install":
    fail(f"only 'pip install' is checked here, not {' '.join(args)!r}")
specs = [a for a in args[1:] if not a.startswith("-")]
if not specs:
    fail("nothing to install")

from importlib import metadata
from packaging.requirements import Requirement

def extras_of(project):
    """extra -> requirement strings, from ./pyproject.toml (this checkout) if present."""
    try:
        import tomllib
        data = tomllib.loads(Path("pyproject.toml").read_text())["project"]
        if data["name"] == project:
            return data.get("optional-dependencies", {}), data.get("dependencies", [])
    except (ImportError, OSError, KeyError):
        pass
    found = {}
    base = []
    for req in metadata.requires(project) or []:
        r = Requirement(req)
        m = re.search(r"extra\\s*==\\s*[\\"']([^\\"']+)", str(r.marker or ""))
        if m:
            found.setdefault(m.group(1), []).append(req.split(";")[0])
        else:
            base.append(req)
    return found, base

def check(req, seen):
    r = Requirement(req)
    try:
        version = metadata.version(r.name)
    except metadata.PackageNotFoundError:
        fail(f"{r.name} is not installed (needed for {req!r})")
    if r.specifier and not r.specifier.contains(version, prereleases=True):
        fail(f"{r.name} {version} is installed; {req!r} is needed")
    if r.name == "daskjobs":
        extras, base = extras_of("daskjobs")
        for dep in base if "base" not in seen else []:
            check(dep, seen | {"base"})
        for extra in sorted(r.extras - seen):
            if extra not in extras:
                fail(f"daskjobs has no extra {extra!r}")
            for dep in extras[extra]:
                check(dep, seen | {extra})

for spec in specs:
    m = re.fullmatch(r"\\.(\\[([\\w,-]+)\\])?", spec)
    if m:
        if not Path("pyproject.toml").exists():
            fail("'.' is not a checkout of daskjobs here")
        spec = "daskjobs" + (m.group(1) or "")
    check(spec, set())
print(f"pip (docs test): {' '.join(specs)} installed here")
'''


def _sandbox(workdir: Path) -> dict[str, str]:
    """Links to the checkout's top-level folders and files; the environment for commands."""
    for entry in ROOT.iterdir():
        if entry.name.startswith(".") or entry.name.endswith(".egg-info"):
            continue
        (workdir / entry.name).symlink_to(entry)
    bindir = workdir / ".docs-bin"
    bindir.mkdir()
    pip = bindir / "pip"
    pip.write_text(f"#!{sys.executable}\n{PIP_SHIM}")
    pip.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "DASKJOBS_"))}
    env["PATH"] = os.pathsep.join(
        [str(bindir), str(Path(sys.executable).parent), env.get("PATH", "")]
    )
    env["MPLBACKEND"] = "Agg"
    env["PYTHONPATH"] = str(workdir)
    env["XDG_CACHE_HOME"] = str(workdir / ".docs-cache")  # the page's own measured history
    env.pop("PYTHONSTARTUP", None)
    return env


def _shell(command: str, env: dict[str, str], cwd: Path, strict: bool) -> dict[str, Any]:
    script = ("set -euo pipefail\n" if strict else "set -o pipefail\n") + command
    try:
        p = subprocess.run(
            ["bash", "-c", script],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        return {"exit": None, "stdout": str(e.stdout or ""), "stderr": f"timed out: {e}"}
    return {"exit": p.returncode, "stdout": p.stdout, "stderr": p.stderr}


def console_commands(code: str) -> list[tuple[str, str]]:
    """(command, expected output) for each ``$ `` line of a console block."""
    out: list[tuple[str, list[str]]] = []
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            cmd = [line[2:]]
            while cmd[-1].rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd.append(lines[i])
            out.append(("\n".join(cmd), []))
        elif out:
            out[-1][1].append(line)
        i += 1
    return [(c, "\n".join(o)) for c, o in out]


def _close_leftovers(namespace: dict[str, Any]) -> None:
    try:
        from distributed import Client
        from distributed.deploy import Cluster
    except ImportError:  # pragma: no cover
        return
    clients = [v for v in namespace.values() if isinstance(v, Client)]
    clusters = [v for v in namespace.values() if isinstance(v, Cluster)]
    clusters += [c.cluster for c in clients if isinstance(c.cluster, Cluster)]
    for v in [*clients, *clusters]:  # Client(daskjobs.local_cluster()): the cluster too
        with contextlib.suppress(Exception):
            v.close()


#: The last line of a bash block that changes the reader's directory.
_CD = re.compile(r"(?:^|&&)\s*cd\s+([^\s;&|]+)\s*$")


def run_page(spec_path: Path) -> None:
    """The page's process: run its blocks in order, write what each printed as JSON."""
    spec = json.loads(spec_path.read_text())
    blocks = [Block(**b) for b in spec["blocks"]]
    workdir = Path(spec["workdir"])
    env = _sandbox(workdir)
    os.chdir(workdir)
    for name in [k for k in os.environ if k.startswith(("DASK_", "DASKJOBS_"))]:
        del os.environ[name]
    # a fresh machine's user cache: the measured durations a page's clusters keep
    # (daskjobs.history.path: auto) are the page's own
    os.environ.update(MPLBACKEND="Agg", XDG_CACHE_HOME=str(workdir / ".docs-cache"))
    sys.path.insert(0, str(workdir))

    shared = None
    address = SHARED
    if any(SHARED in b.code for b in blocks):
        from distributed import LocalCluster

        shared = LocalCluster(
            n_workers=2,
            threads_per_worker=2,
            processes=False,
            protocol="tcp",
            host="127.0.0.1",
            dashboard_address=":0",
        )
        address = shared.scheduler_address

    namespace: dict[str, Any] = {"__name__": "__main__"}
    results: list[dict[str, Any]] = []
    for b in blocks:
        code = b.code.replace(SHARED, address)
        t0, done = time.perf_counter(), len(results)
        if b.lang == "python":
            out = io.StringIO()
            error = None
            try:
                if "file" in b.marks:
                    target = workdir / b.marks["file"]
                    target.write_text(code)
                    with contextlib.redirect_stdout(out):
                        __import__(target.stem)
                else:
                    # padded so that a traceback names the markdown file's own line numbers
                    compiled = compile("\n" * (b.line - 1) + code, b.page, "exec")
                    with contextlib.redirect_stdout(out):
                        exec(compiled, namespace)
            except BaseException:
                error = traceback.format_exc()
            results.append({"where": b.where, "stdout": out.getvalue(), "error": error})
        elif b.lang == "bash":
            r = _shell(code, env, workdir, strict=True)
            results.append({"where": b.where, **r})
            moved = _CD.search(code.strip().splitlines()[-1])
            if moved and r["exit"] == 0:
                workdir = (workdir / moved.group(1)).resolve()
                os.chdir(workdir)
                sys.path.insert(0, str(workdir))
        elif b.lang == "console":
            for n, (cmd, _) in enumerate(console_commands(code)):
                r = _shell(cmd, env, workdir, strict=False)
                results.append({"where": b.where, "command": cmd, "n": n, **r})
        if len(results) > done:
            results[-1]["seconds"] = round(time.perf_counter() - t0, 2)
    _close_leftovers(namespace)
    if shared is not None:
        shared.close()
    Path(spec["result"]).write_text(json.dumps({"address": address, "results": results}))


# -- the tests ----------------------------------------------------------------------------------

_pages = {p: parse(p) for p in PAGES}


def _runnable(blocks: list[Block]) -> list[Block]:
    return [b for b in blocks if b.lang in RUN and "no-run" not in b.marks]


@dataclass
class PageRun:
    proc: subprocess.CompletedProcess[str]
    result: Path


def _start(page: Path, tmp: Path) -> PageRun:
    workdir = tmp / "work"
    workdir.mkdir(parents=True)
    spec = tmp / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "workdir": str(workdir),
                "result": str(tmp / "result.json"),
                "blocks": [asdict(b) for b in _runnable(_pages[page])],
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "DASKJOBS_"))}
    env["MPLBACKEND"] = "Agg"
    proc = subprocess.run(
        [sys.executable, __file__, str(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=COMMAND_TIMEOUT * 2,
        stdin=subprocess.DEVNULL,
    )
    return PageRun(proc, tmp / "result.json")


def _page_id(p: Path) -> str:
    return str(p.relative_to(ROOT))


class _LazyRuns(dict[Path, "Future[PageRun]"]):
    """A page's run, started when its test asks for it (one page at a time)."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, page: Path) -> Future[PageRun]:
        future: Future[PageRun] = Future()
        future.set_result(_start(page, self.tmp_path_factory.mktemp(page.stem.lower())))
        self[page] = future
        return future


@pytest.fixture(scope="module")
def page_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[Path, Future[PageRun]]:
    """Every selected page starts at once (three at a time): most of a page's time is
    waiting for clusters to start and stop, and the suite's wall time is what counts.

    Under pytest-xdist each worker collects every test but runs only those it is sent:
    with ``--dist loadgroup`` (the README's command) the pages' tests are one group, sent
    to one worker, which starts them all as above; with another ``--dist`` a worker starts
    a page when its test runs (it cannot know which pages it will be sent)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is not None and request.config.getoption("dist", "no") != "loadgroup":
        return _LazyRuns(tmp_path_factory)
    selected = {
        item.callspec.params["page"]
        for item in request.session.items
        if item.module is request.module
        and hasattr(item, "callspec")
        and "page" in item.callspec.params
    }
    pool = ThreadPoolExecutor(3)
    request.addfinalizer(pool.shutdown)
    # the longest first: a bash block is a script of several commands (README.md, chapter.md)
    ordered = sorted(
        selected, key=lambda p: -sum(10 if b.lang == "bash" else 1 for b in _runnable(_pages[p]))
    )
    return {p: pool.submit(_start, p, tmp_path_factory.mktemp(p.stem.lower())) for p in ordered}


@pytest.mark.slow
@pytest.mark.xdist_group("docs-pages")  # one worker runs them all, three at a time (page_runs)
# a page's process may take COMMAND_TIMEOUT * 2 (_start) after it waited for a free slot of
# page_runs' pool: more than pytest-timeout's 300 s on a loaded machine (docs/explanation/chapter.md
# at 13)
@pytest.mark.timeout(COMMAND_TIMEOUT * 2 + 120)
@pytest.mark.parametrize("page", [p for p in PAGES if _runnable(_pages[p])], ids=_page_id)
def test_page_runs_as_documented(page: Path, page_runs: dict[Path, Future[PageRun]]) -> None:
    run = page_runs[page].result()
    proc, result_file = run.proc, run.result
    if proc.returncode != 0 or not result_file.exists():
        pytest.fail(f"{_page_id(page)}: the page's process failed:\n{proc.stderr[-8000:]}")
    run_result = json.loads(result_file.read_text())
    results, address = run_result["results"], run_result["address"]
    by_block = {b.where: b for b in _runnable(_pages[page])}
    problems: list[str] = []
    for r in results:
        b = by_block[r["where"]]
        head = f"{r['where']} ({b.lang})" + (f": $ {r['command']}" if "command" in r else "")
        if r.get("error"):
            problems.append(f"{head} raised:\n{r['error']}")
            continue
        if "exit" in r and r["exit"] != 0:
            problems.append(
                f"{head} exited with {r['exit']}:\n{r['stdout'][-3000:]}\n{r['stderr'][-5000:]}"
            )
            continue
        if "no-compare" in b.marks:
            continue
        if b.lang == "python" and b.expected is not None:
            expected = b.expected
        elif b.lang == "console":
            expected = console_commands(b.code)[r["n"]][1]
        else:
            continue
        expected = expected.replace(SHARED, address)
        if expected.strip() and not matches(expected, r["stdout"]):
            problems.append(
                f"{head}: its output differs from what the page shows:\n"
                f"{_diff(expected, r['stdout'])}"
            )
    assert not problems, "\n\n".join(problems)


def test_tutorial_runs_as_a_saved_script(tmp_path: Path) -> None:
    """docs/tutorial.md's Python blocks up to its shared cluster, saved as one script under the
    main guard its install section names, run with ``python tutorial.py`` in an empty
    directory: dask's worker processes import the script again, and it prints what the page
    shows."""
    blocks = [b for b in _runnable(_pages[ROOT / "docs" / "tutorial.md"]) if b.lang == "python"]
    laptop = blocks[: next(i for i, b in enumerate(blocks) if "client.close()" in b.code)]
    assert len(laptop) >= 3 and all(b.expected is not None for b in laptop)
    body = "".join(b.code for b in laptop)
    script = 'if __name__ == "__main__":\n' + "".join(
        f"    {line}\n" if line.strip() else "\n" for line in body.splitlines()
    )
    (tmp_path / "tutorial.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "DASKJOBS_"))}
    env.update(MPLBACKEND="Agg", XDG_CACHE_HOME=str(tmp_path / ".cache"))
    proc = subprocess.run(
        [sys.executable, "tutorial.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = "".join(b.expected or "" for b in laptop)
    assert matches(expected, proc.stdout), _diff(expected, proc.stdout)
    # the script never closes its cluster: dask closes it as the interpreter exits, and the
    # measured durations are saved then all the same (no new threads at that point)
    assert "could not save" not in proc.stderr, proc.stderr[-3000:]
    assert (tmp_path / ".cache" / "daskjobs" / "history.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".cache",
        "sweep.jsonl",
        "tutorial-store",
        "tutorial.py",
    ]


def test_every_block_is_run_or_says_why() -> None:
    skips = []
    for blocks in _pages.values():
        for b in blocks:
            assert b.lang in RUN | NOT_RUN, f"{b.where}: unknown block language {b.lang!r}"
            for name, value in b.marks.items():
                if name.startswith("_"):
                    continue
                assert name in MARKS, f"{b.where}: unknown mark {name!r}"
                assert value, f"{b.where}: the mark {name!r} needs a reason or a value"
                if name in ("no-run", "no-compare"):
                    assert b.lang in RUN, f"{b.where}: {name} on a block that never runs"
                    skips.append(f"{b.where} {name}: {value}")
            if "file" in b.marks:
                assert b.lang == "python" and b.marks["file"].endswith(".py"), b.where
            if b.lang == "console":
                assert console_commands(b.code), f"{b.where}: no $ command (output: text)"
    assert len(skips) <= MAX_SKIPS, "too many skipped blocks:\n" + "\n".join(skips)


@pytest.mark.slow
def test_the_site_builds_without_warnings(tmp_path: Path) -> None:
    """mkdocs.yml's site, warnings as errors: broken links and anchors, pages left out of the
    nav, API entries naming nothing (``.ci/run`` builds it too); the generated reference is in
    the built pages."""
    for module in ("mkdocs", "mkdocstrings", "mkdocs_click"):
        pytest.importorskip(module, reason="the docs extra: pip install -e '.[docs]'")
    p = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=COMMAND_TIMEOUT,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    site = tmp_path / "site"
    assert (site / "explanation" / "chapter" / "index.html").exists()
    # the generated reference: an API entry per public name, the CLI, every config key
    import daskjobs

    api = (site / "reference" / "api" / "daskjobs" / "index.html").read_text()
    for name in daskjobs.__all__:
        assert f'id="daskjobs.{name}"' in api, name
    for page in sorted((ROOT / "docs" / "reference" / "api").glob("*.md")):
        built = (site / "reference" / "api" / page.stem / "index.html").read_text()
        module, *entries = re.findall(r"^:::\s+([\w.]+)\s*$", page.read_text(), re.MULTILINE)
        for path in entries:  # the first is the page's module docstring, without a heading
            assert f'id="{path}"' in built, f"{page.name}: {path} is not on the built page"
    cli = (site / "reference" / "cli" / "index.html").read_text()
    for command in ("simulate", "replay", "cache", "status", "start-rate", "jobs"):
        assert f"daskjobs {command}" in cli, command
    config = (site / "reference" / "config" / "index.html").read_text()
    assert "daskjobs-config-keys" not in config
    for key in (
        "daskjobs.speculation.late-factor",
        "daskjobs.jobs.backlog",
        "daskjobs.teams.quotas",
    ):
        assert f"<code>{key}</code>" in config, key


def test_output_matching() -> None:
    assert matches("a\n...\nd\n", "a\nb\nc\nd\n")
    assert matches("a\n...\nd", "a\nd")
    assert matches("x = ... s", "x = 1.5 s  ")
    assert not matches("a\nd", "a\nb\nd")
    assert not matches("x = 1 s", "x = 2 s")
    assert console_commands("$ a \\\n  b\nout\n$ c\n") == [("a \\\n  b", "out"), ("c", "")]


def test_parse_marks_and_outputs(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text(
        "text\n\n<!-- no-run: needs a real cluster -->\n```python\nboom()\n```\n\n"
        "```python\nprint(1)\n```\n\n```text\n1\n```\n\n- item\n\n  ```console\n"
        "  $ echo hi\n  hi\n  ```\n"
    )
    blocks = parse(md, root=tmp_path)
    assert [b.lang for b in blocks] == ["python", "python", "text", "console"]
    assert blocks[0].marks == {"no-run": "needs a real cluster"} and blocks[0].line == 5
    assert blocks[1].expected == "1\n" and blocks[3].code == "$ echo hi\nhi\n"


if __name__ == "__main__":
    run_page(Path(sys.argv[1]))
