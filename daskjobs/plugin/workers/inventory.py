"""The worker half of resources: each worker reports what it has (docs/explanation/resources.md).

:class:`InventoryReporter` is a ``WorkerPlugin`` the scheduler plugin installs on every
current and future worker when ``daskjobs.resources.enabled`` is on. At setup, and every
``interval`` seconds after, it reads the worker's inventory and, when it changed, sends
it with a growing version (``Worker.log_event`` on the worker's own stream, topic
``daskjobs-inventory``). Sources, first found wins:

1. the ``DASKJOBS_INVENTORY`` environment variable of the worker process (JSON);
2. the worker's dask config ``daskjobs.inventory`` (``DASK_DASKJOBS__INVENTORY``, a YAML
   file): an inventory, or ``{"by-name": {<worker name>: inventory, "*": default}}``
   (in-process clusters, where every worker reads the same config);
3. ``nvidia-smi`` where present: the GPUs' type (``NVIDIA A100-SXM4-40GB`` -> ``A100``),
   count and memory (the smallest device's);
4. nothing: no accelerator.

An inventory is ``{"accelerator": "A100", "gpus": 2, "gpu_memory": "40GB"}`` (the
scheduler checks it: :meth:`daskjobs.policies.resources.Inventory.from_dict`); the
worker adds its threads (``cpus``), memory limit and dask resources (``resources``,
the counts dask enforces: ``dask worker --resources GPU=2``) unless given.

Pickled *by value* (:func:`inventory_bytes`): workers need ``distributed``, not daskjobs.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["INVENTORY_NAME", "INVENTORY_TOPIC", "InventoryReporter", "inventory_bytes"]

#: Event topic of the inventory reports.
INVENTORY_TOPIC = "daskjobs-inventory"
#: Name the reporter is installed under on the workers.
INVENTORY_NAME = "daskjobs-inventory"
ENV = "DASKJOBS_INVENTORY"

logger = logging.getLogger("daskjobs.plugin.inventory")


def nvidia_smi() -> dict[str, Any] | None:
    """The GPUs ``nvidia-smi`` lists, as an inventory; None without the tool or GPUs."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names, mems = [], []
    for line in out.splitlines():
        if "," not in line:
            continue
        name, mem = (p.strip() for p in line.rsplit(",", 1))
        name = name.removeprefix("NVIDIA ").strip()
        names.append(name.split("-")[0].split(" ")[0] or name)
        try:
            mems.append(float(mem) * 2**20)  # MiB
        except ValueError:
            mems.append(0.0)
    if not names:
        return None
    return {"accelerator": names[0], "gpus": len(names), "gpu_memory": min(mems)}


class InventoryReporter(WorkerPlugin):
    """Report the worker's inventory at setup and whenever it changes."""

    idempotent = False

    def __init__(self, interval: float = 30.0) -> None:
        self.interval = interval
        self.worker: Any = None
        self.version = 0
        self.last: Any = None
        self.failures = 0

    def setup(self, worker: Any) -> None:
        self.worker = worker
        self.refresh()
        if self.interval > 0:
            from tornado.ioloop import PeriodicCallback

            pc = PeriodicCallback(self.refresh, self.interval * 1000)
            worker.periodic_callbacks[INVENTORY_NAME] = pc
            pc.start()

    def teardown(self, worker: Any) -> None:
        pc = worker.periodic_callbacks.pop(INVENTORY_NAME, None)
        if pc is not None:
            pc.stop()
        self.worker = None

    def read(self) -> tuple[dict[str, Any], str]:
        """This worker's inventory and where it came from."""
        worker = self.worker
        raw: Any = None
        source = "none"
        text = os.environ.get(ENV)
        if text:
            raw, source = json.loads(text), f"${ENV}"
        else:
            import dask

            raw = dask.config.get("daskjobs.inventory", default=None)
            if raw is not None:
                source = "config"
            else:
                raw = nvidia_smi()
                source = "nvidia-smi" if raw is not None else "none"
        if isinstance(raw, dict) and "by-name" in raw:
            table = raw["by-name"] or {}
            raw = table.get(str(worker.name), table.get("*"))
        if raw is None:
            inv: dict[str, Any] = {}
        elif isinstance(raw, dict):
            inv = dict(raw)
        else:
            inv = {"invalid": f"expected a mapping, got {raw!r}"}
        inv.setdefault("cpus", worker.state.nthreads)
        limit = getattr(getattr(worker, "memory_manager", None), "memory_limit", None)
        inv.setdefault("memory", limit or 0)
        inv.setdefault("resources", dict(worker.state.total_resources))
        return inv, source

    def refresh(self) -> None:
        """Read the inventory; report it when it changed (a new version)."""
        try:
            inv, source = self.read()
        except Exception as e:  # a malformed variable: reported, the scheduler names it
            inv, source = {"invalid": f"{type(e).__name__}: {e}"}, "error"
        if inv == self.last:
            return
        self.last = inv
        self.version += 1
        try:
            msg = {"inventory": inv, "version": self.version, "source": source}
            self.worker.log_event(INVENTORY_TOPIC, msg)
        except Exception:
            self.failures += 1
            logger.warning("daskjobs: reporting this worker's inventory failed", exc_info=True)


def inventory_bytes(interval: float = 30.0) -> bytes:
    """A pickled :class:`InventoryReporter`, by value, for ``register_worker_plugin``."""
    import sys

    import cloudpickle

    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(InventoryReporter(interval))
    finally:
        cloudpickle.unregister_pickle_by_value(module)
