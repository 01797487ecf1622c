"""Regenerate the benchmarks page's figures: each benchmark's markdown and plot.

Usage::

    python benchmarks/figures.py --out /tmp/figures            # every figure (long)
    python benchmarks/figures.py --out /tmp/figures --quick    # small sizes, a few minutes
    python benchmarks/figures.py --out /tmp/figures --only plugin --only fairshare
    python benchmarks/figures.py --list                        # names and commands

Runs each benchmark of :data:`FIGURES` as its own process, one after the other (never two
at once: they would measure each other), with ``--markdown OUT/<name>.md`` and, where it
draws one, ``--plot OUT/<name>.png``: every figure comes with the command and the machine
that produced it. docs/benchmarks.md shows the plots as ``docs/img/bench/<name>.png``, each
under the command that drew it, and the tables of the full runs beside their commands. Keep
``OUT`` outside docs/: a markdown file there that is not in mkdocs.yml's nav fails the
strict build. A benchmark that fails is named at the end and the exit status is 1; the
others' files are still written.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: name -> (script, its options for the page's figures, whether it draws a plot).
FIGURES: dict[str, tuple[str, tuple[str, ...], bool]] = {
    "sim": ("bench_sim.py", (), True),
    "plugin": ("bench_plugin.py", (), True),
    "speculation-grid": ("bench_speculation.py", (), True),
    "speculation-chapter": ("bench_speculation.py", ("--chapter",), True),
    "speculation-model": ("bench_speculation.py", ("--model", "0,600,800,1200"), True),
    "estimates": ("bench_estimates.py", (), True),
    "fairshare": ("bench_fairshare.py", (), True),
    "steal-order": ("bench_steal_order.py", (), True),
    "replay": ("bench_replay.py", (), True),
    "zombie": ("bench_zombie.py", (), True),
    "jobs": ("bench_jobs.py", (), True),
    "cache": ("bench_cache.py", (), True),
    "preemption": ("bench_preemption.py", (), True),
    "gangs": ("bench_gangs.py", (), True),
    "chaos": ("bench_chaos.py", (), False),
}


def command(name: str, out: Path, quick: bool) -> list[str]:
    script, options, plot = FIGURES[name]
    cmd = [sys.executable, str(HERE / script), *options]
    if quick:
        cmd.append("--quick")
    cmd += ["--markdown", str(out / f"{name}.md")]
    if plot:
        cmd += ["--plot", str(out / f"{name}.png")]
    return cmd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="directory for the .md and .png files")
    ap.add_argument("--quick", action="store_true", help="each benchmark with --quick")
    ap.add_argument("--only", action="append", choices=sorted(FIGURES), help="repeatable")
    ap.add_argument("--list", action="store_true", help="print the names and commands")
    args = ap.parse_args(argv)
    names = args.only or list(FIGURES)
    if args.list:
        for name in names:
            script, options, _ = FIGURES[name]
            print(f"{name}: python benchmarks/{' '.join([script, *options])}")
        return 0
    if args.out is None:
        ap.error("--out DIR is needed (or --list)")
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in names:
        t0 = time.time()
        print(f"{name} ...", file=sys.stderr, flush=True)
        run = subprocess.run(command(name, args.out, args.quick), stdout=subprocess.DEVNULL)
        took = time.time() - t0
        if run.returncode:
            failed.append(name)
            print(f"{name}: FAILED (exit {run.returncode}) after {took:.0f} s", file=sys.stderr)
        else:
            print(f"{name}: {took:.0f} s -> {args.out / name}.md", file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
