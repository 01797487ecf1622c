"""dask/distributed's own tests, with daskjobs' preload in every test scheduler.

Usage::

    python benchmarks/dask_suite.py PATH            # the six files below
    python benchmarks/dask_suite.py PATH -- -k priorities -x   # more pytest options

``PATH`` is a checkout of distributed's source (its wheel and sdist ship no tests), of
the release installed here or close to it, e.g. from a bare mirror::

    git --git-dir=/path/to/distributed.git worktree add --detach /tmp/distributed HEAD
    # or: mkdir /tmp/distributed && git --git-dir=... archive HEAD | tar -x -C /tmp/distributed

A plugin operators preload for everyone must not change what dask promises users who
never asked for it (docs/explanation/dask-promises.md). This script runs distributed's test files
about priorities, resources, the scheduler, work stealing, cancelled tasks and failed
workers from ``PATH`` against the *installed* distributed (``--import-mode=importlib``:
``PATH`` is never put on ``sys.path``), with ``distributed.scheduler.preload:
[daskjobs.preload]`` in dask's config, so that every ``Scheduler`` a test makes loads
daskjobs' plugin under its default configuration. The pytest plugin that does so
(``_dask_suite_preload``, passed with ``-p``) also counts the schedulers that started
and the daskjobs plugins among them: the run fails if any scheduler ran without it.

:data:`NOT_KEPT` lists the tests deliberately deselected, each with its reason; the
script prints them. Nothing of distributed's is copied into this repository: its tests
are read from ``PATH`` at run time. Exit status: pytest's (0: every selected test
passed).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: distributed's test files this script runs (distributed/tests/...).
FILES = (
    "test_priorities.py",
    "test_resources.py",
    "test_scheduler.py",
    "test_steal.py",
    "test_cancelled_state.py",
    "test_failed_workers.py",
)

#: Tests deliberately not run, with the reason (node id relative to distributed/tests/).
NOT_KEPT: dict[str, str] = {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="a checkout of distributed's source")
    parser.add_argument(
        "--files", nargs="+", default=list(FILES), help="test files of distributed/tests"
    )
    parser.add_argument("--plain", action="store_true", help="plain dask: no preload (to compare)")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: len(argv) - len(extra) - (1 if extra else 0)])
    tests = args.path / "distributed" / "tests"
    missing = [f for f in args.files if not (tests / f).is_file()]
    if missing:
        parser.error(f"{args.path} is not a checkout of distributed's source: no {missing}")
    for node, why in NOT_KEPT.items():
        print(f"not kept: {node}: {why}")
    env = dict(os.environ)
    # the plugin module (benchmarks/), and this tree's daskjobs ahead of an installed one
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
    )
    with tempfile.TemporaryDirectory(prefix="dask-suite-") as tmp:
        if not args.plain:
            env["DASK_DISTRIBUTED__SCHEDULER__PRELOAD"] = '["daskjobs.preload"]'
        env["DASKJOBS_DASK_SUITE_TESTS"] = str(tests)  # the TLS certificates are there
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            *(str(tests / f) for f in args.files),
            f"--rootdir={args.path}",
            "--import-mode=importlib",
            "-p",
            "_dask_suite_preload",
            "-p",
            "no:cacheprovider",
            "-q",
            "-o",
            "addopts=--strict-markers -p no:asyncio -p no:legacypath -rfE",
            *(f"--deselect={tests / node}" for node in NOT_KEPT),
            *extra,
        ]
        print("$", " ".join(cmd), flush=True)
        # cwd outside PATH and this tree: neither is imported from the current directory
        return subprocess.call(cmd, cwd=tmp, env=env)


if __name__ == "__main__":
    sys.exit(main())
