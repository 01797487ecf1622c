"""Preload for shared clusters: ``dask scheduler --preload plugins/daskjobs_scheduler.py``.

Options after the preload (``--daskjobs-policy lpt``) override the ``daskjobs``
section of dask's config; the logic lives in the ``daskjobs`` package.
"""

from __future__ import annotations

import click

from daskjobs import JobsPlugin


@click.command()
@click.option("--daskjobs-policy", default=None, help="fifo | lpt | critical-path | fair-share")
@click.option("--daskjobs-history", default=None, help="JSON file of measured stage durations")
@click.option("--daskjobs-record", default=None, help="write a trace of the run (JSON Lines)")
def dask_setup(scheduler, daskjobs_policy=None, daskjobs_history=None, daskjobs_record=None):
    overrides = {}
    if daskjobs_record:
        overrides["record"] = daskjobs_record
    if daskjobs_policy:
        overrides["policy"] = daskjobs_policy
    if daskjobs_history:
        overrides["history"] = {"path": daskjobs_history}
    scheduler.add_plugin(JobsPlugin(**overrides))
