"""Sweeps: stages over parameter grids, built as content-keyed Dask graphs.

A sweep is described once, in the order one thinks about it::

    from daskjobs import Sweep, grid
    from daskjobs.examples import crossover_backtest, rolling_features, synthetic_prices

    sweep = Sweep("backtests", team="quant")
    prices = sweep.stage(synthetic_prices, over=grid(slice=range(8)), params={"bars": 20_000})
    features = sweep.stage(
        rolling_features,
        inputs={"prices": prices},
        params={"windows": (5, 10, 20, 50, 100)},
        estimate=0.5,
    )
    backtests = sweep.stage(
        crossover_backtest,
        inputs={"features": features},
        over=grid(fast=[5, 10, 20], slow=[50, 100]),
        params={"cost_bps": 5.0},
        estimate=lambda p: 0.0002 * p["slow"],
    )
    result = sweep.run(client)        # or daskjobs.run(sweep, client)
    result.table()                    # a column per label and per field of the result

(the README's example, run by its tests.)

How stages fan out
------------------
Each stage is expanded into *nodes* (one function call each) as soon as it is declared:

* ``over=`` is the stage's own grid: :func:`grid` for a cartesian product, :func:`cases` for an
  explicit list of points, ``grid(...) * cases(...)`` and ``+`` to combine them.
  ``params=`` are fixed keyword arguments shared by every node.
* ``inputs=`` maps the function's argument names to upstream stages. The upstream nodes are
  combined by a natural join on their *labels* (the swept parameters they carry): a backtest
  reading ``features`` (one per ``slice``) and ``prices`` (one per ``slice``) gets the pair with
  the same ``slice``; inputs with no label in common are crossed. Then the result is crossed with
  the stage's own grid.
* A node's labels are its upstream labels plus its own swept parameters; they label the results.
  A swept parameter may not reuse an upstream label's name (that would be ambiguous).

Every node's Dask key is its content key (:mod:`daskjobs.cache.keys`), so a feature read by a
hundred backtests is one node, computed once.

What reaches the scheduler
--------------------------
:meth:`Sweep.to_dask` returns :class:`SweepGraph`, an ordinary Dask collection
(``dask.compute``, ``client.compute``, and ``client.get(graph.__dask_graph__(), graph.keys)``
all accept it). Its graph is a ``HighLevelGraph`` with one layer per stage and kind, whose layer
annotations reach ``TaskState.annotations`` on the scheduler: ``stage`` (the stage name),
``estimate`` (seconds, if given), ``params`` (the node's labels and parameters, which the
scheduler's duration model learns from), ``team``, ``resources``, ``retries``, ``speculate``
and ``cache``; loads from the store also carry ``load: True``.

Caching
-------
Before the graph is built the store is consulted once (one listing). A cacheable node whose key
is stored becomes a *load* task with no dependencies, and every upstream node needed only by
loads is left out of the graph. Computed nodes commit their result to the store from the worker
that computed them. If a load finds its entry corrupt or gone, it is removed and the load task
recomputes the value itself (loading or recomputing its inputs the same way), so a bad entry
costs time, never a wrong or missing result. In a store the workers cannot write, a corrupt
entry is recomputed all the same and not written back.

Three controls change what a lookup finds (docs/explanation/cache.md): a stage's ``ignore=`` leaves
parameters out of its key; its ``max_age=`` makes an older entry a miss; ``refresh=`` (a stage
option, or for one run) recomputes stored results. An entry recomputed for either reason is
overwritten atomically, and so is every entry that reads it (its key did not change).

A store that cannot be written never fails a stage: the value is returned, the worker logs the
first failure (later ones at DEBUG), and :func:`run` warns once per sweep with the count
(:attr:`SweepResult.store_errors`).

Running on a cluster
--------------------
:func:`run` checks first that the scheduler and the workers can import the modules of the stage
functions, and stops with :class:`ClusterImportError` naming them and the fix (install them on
the cluster, or ``cloudpickle.register_pickle_by_value(module)``, which sweeps honour for stage
functions and parameters) before anything is submitted: dask would otherwise leave a graph the
scheduler cannot read pending forever, or lose every worker that receives a task it cannot
unpickle. Then it waits until every output has settled, however often: an output whose worker
died after it finished is recomputed by dask, and waited for. The counts in
:class:`SweepResult` are what the workers report having done (through dask's event topic
``daskjobs.cache``), not what was planned: a stage whose input failed, or that dask found
already in memory, did not run and is not counted.

How the package is laid out
---------------------------
One module per concern, in the order a sweep goes through them:
:mod:`~daskjobs.sweep.grids` (the points a stage is swept over),
:mod:`~daskjobs.sweep.stages` (:class:`Sweep`, its stages and nodes),
:mod:`~daskjobs.sweep.worker` (the tasks that run a stage on a worker),
:mod:`~daskjobs.sweep.shipping` (how stage functions reach the cluster, and the checks that they
can), :mod:`~daskjobs.sweep.planning` (cache hits become loads) and
:mod:`~daskjobs.sweep.graph` (the Dask collection and its annotations),
:mod:`~daskjobs.sweep.running` (:func:`run` and its :class:`SweepResult`) and
:mod:`~daskjobs.sweep.diagnosis` (failed stages, a refused graph, an interrupted run).
"""

from __future__ import annotations

from daskjobs.sweep.diagnosis import (
    StageFailure,
    SweepCancelled,
    SweepInterrupted,
    SweepKeyboardInterrupt,
)
from daskjobs.sweep.graph import SweepGraph
from daskjobs.sweep.grids import Grid, cases, grid
from daskjobs.sweep.running import SweepResult, quiet_workers, run
from daskjobs.sweep.shipping import ClusterImportError
from daskjobs.sweep.stages import Node, Stage, Sweep
from daskjobs.sweep.worker import StageError

__all__ = [
    "ClusterImportError",
    "Grid",
    "Node",
    "Stage",
    "StageError",
    "StageFailure",
    "Sweep",
    "SweepCancelled",
    "SweepGraph",
    "SweepInterrupted",
    "SweepKeyboardInterrupt",
    "SweepResult",
    "cases",
    "grid",
    "quiet_workers",
    "run",
]
