"""``daskjobs.config.configure_logging``: the daskjobs loggers configured from dask's
logging config the way distributed configures its own (tests/real/test_real_logging.py reads
a real scheduler's log)."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from daskjobs.config import configure_logging

NAMES = ("daskjobs", "daskjobs.jobs", "daskjobs.plugin")


@contextmanager
def bare_logging() -> Iterator[None]:
    """No handler on the root logger (a scheduler process's state when daskjobs is
    imported; pytest adds its own while a test runs) nor on daskjobs' loggers;
    everything put back afterwards."""
    root = logging.getLogger()
    saved_root = root.handlers[:]
    saved = {}
    for n in NAMES:
        lg = logging.getLogger(n)
        saved[n] = (lg.handlers[:], lg.level, lg.propagate)
        lg.handlers.clear()
        lg.setLevel(logging.NOTSET)
        lg.propagate = True
    root.handlers.clear()
    try:
        yield
    finally:
        root.handlers[:] = saved_root
        for n, (handlers, level, propagate) in saved.items():
            lg = logging.getLogger(n)
            lg.handlers[:], lg.level, lg.propagate = handlers, level, propagate


def _emit(config: dict[str, Any]) -> str:
    configure_logging(config)
    top = logging.getLogger("daskjobs")
    out = io.StringIO()
    for h in top.handlers:
        assert isinstance(h, logging.StreamHandler)
        h.setStream(out)  # type: ignore[type-var]
    logging.getLogger("daskjobs.plugin").info("an info line")
    logging.getLogger("daskjobs.jobs").info("a quiet line")
    logging.getLogger("daskjobs.jobs").warning("a warning")
    return out.getvalue()


def test_info_lines_in_dasks_format_at_the_levels_dask_config_names() -> None:
    with bare_logging():
        config = {
            "logging": {"daskjobs.jobs": "warning"},
            "distributed": {
                "admin": {"log-format": "%(asctime)s - %(name)s - %(levelname)s - %(message)s"}
            },
        }
        lines = _emit(config).splitlines()
        stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
        assert len(lines) == 2, lines
        assert re.fullmatch(f"{stamp} - daskjobs.plugin - INFO - an info line", lines[0])
        assert re.fullmatch(f"{stamp} - daskjobs.jobs - WARNING - a warning", lines[1])
        configure_logging(config)  # idempotent: still one handler
        assert len(logging.getLogger("daskjobs").handlers) == 1
        assert logging.getLogger("daskjobs").propagate is False


def test_distributed_logging_section_is_read_too() -> None:
    with bare_logging():
        configure_logging({"distributed": {"logging": {"daskjobs": "error"}}})
        assert logging.getLogger("daskjobs").level == logging.ERROR


def test_a_full_logging_config_is_the_operators() -> None:
    with bare_logging():
        configure_logging({"logging": {"version": 1, "daskjobs": "error"}})
        assert logging.getLogger("daskjobs").handlers == []


def test_an_application_that_configured_logging_gets_the_records() -> None:
    with bare_logging():
        logging.getLogger().addHandler(logging.NullHandler())
        configure_logging({})
        top = logging.getLogger("daskjobs")
        assert top.handlers == [] and top.propagate is True and top.level == logging.INFO
