"""The forecast benchmark's parts (run it with ``python benchmarks/bench_forecast.py``):

* :mod:`forecast.tasks` - the sleep tasks the workers run (a worker named in
  ``DASKJOBS_BENCH_SLOW`` sleeps longer), each returning when it ended;
* :mod:`forecast.workloads` - the three workloads: the plugin's settings, the graph, the
  first sweep that teaches the durations where one does;
* :mod:`forecast.measure` - one run on ``dask scheduler`` and ``dask worker`` processes:
  forecasts and dask's rate extrapolation at the checkpoints, the actual end; the figures
  over runs.
"""
