"""The machine a benchmark ran on, as one block of markdown lines.

Every figure on the benchmarks page sits beside the machine that produced it: the CPU
model, its cores and memory, the Python, dask and distributed versions, the commit
measured, the load average, and one CPU's speed as the pages compare machines
(``sum(range(10**7))``, best of 3: on a shared machine the same code runs slower from
one hour to the next, and this figure says how fast the hour was).

Nothing here imports dask or distributed until :func:`machine` is called, so a
benchmark's child processes can import the harness for free.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

#: The repository this harness belongs to (its commit is the code measured).
REPO = Path(__file__).resolve().parent.parent.parent


def cpu_speed(reps: int = 3) -> float:
    """One CPU's speed: seconds for ``sum(range(10**7))``, the best of ``reps``."""
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        sum(range(10**7))
        best = min(best, time.perf_counter() - t0)
    return best


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else ``platform``'s)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gb() -> float:
    """The machine's memory in GiB (NaN where it cannot be read)."""
    try:
        import psutil  # a dependency of distributed

        return psutil.virtual_memory().total / 2**30
    except ImportError:  # pragma: no cover - distributed brings psutil
        return math.nan


def load_average() -> str:
    """The 1/5/15-minute load average: other work on the machine skews wall times."""
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return "n/a"


def revision(repo: Path = REPO) -> str:
    """The commit measured, with the files of the package changed since (if any)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--", "daskjobs"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    changed = [line[3:] for line in dirty if line.strip()]
    return head + (f", uncommitted changes in {', '.join(changed)}" if changed else "")


def _version(module: str) -> str:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # not installed
        return "not installed"


@dataclass(frozen=True)
class Machine:
    """What a benchmark ran on (:func:`describe` measures it)."""

    date: str
    cpu: str
    cores: int
    memory_gb: float
    python: str
    dask: str
    distributed: str
    numpy: str
    platform: str
    revision: str
    load: str
    speed_ms: float

    def markdown(self) -> str:
        """The machine as the markdown list every benchmark prints under its title."""
        return (
            f"- date: {self.date}, daskjobs at {self.revision}\n"
            f"- machine: {self.cpu}, {self.cores} CPUs, {self.memory_gb:.0f} GiB, "
            f"{self.platform}\n"
            f"- python {self.python}, dask {self.dask}, distributed {self.distributed}, "
            f"numpy {self.numpy}\n"
            f"- one CPU: `sum(range(10**7))` {self.speed_ms:.0f} ms (best of 3); "
            f"load average at the end {self.load}"
        )


def describe() -> Machine:
    """Measure the machine now (takes about a second: the CPU speed runs three times)."""
    return Machine(
        date=f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        cpu=cpu_model(),
        cores=os.cpu_count() or 1,
        memory_gb=memory_gb(),
        python=platform.python_version(),
        dask=_version("dask"),
        distributed=_version("distributed"),
        numpy=_version("numpy"),
        platform=platform.platform(terse=True),
        revision=revision(),
        load=load_average(),
        speed_ms=cpu_speed() * 1000,
    )


def machine() -> str:
    """The machine block (:meth:`Machine.markdown`) measured now."""
    return describe().markdown()
