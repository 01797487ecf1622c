"""The speculation benchmark's experiments, one module each (run them with
``python benchmarks/bench_speculation.py``; its docstring says which option runs which).

* :mod:`speculation.workload` - the sweeps (sleep tasks, one or more workers slow), the
  tasks that log their own attempts, the grid's workloads;
* :mod:`speculation.chapter` - the chapter sweep, five configurations, in one process;
* :mod:`speculation.chapter_real` - the chapter sweep on ``dask scheduler`` and
  ``dask worker`` processes;
* :mod:`speculation.grid` - the full plugin against plain dask on the grid of workloads;
* :mod:`speculation.lost` - the grid's tables: where the lost slot-time went
  (:func:`daskjobs.timeline.decompose`) and the load at the end of each run;
* :mod:`speculation.model` - the grid in the simulator, by the scheduler's dispatch
  capacity;
* :mod:`speculation.probe` - fixed costs: submission to first task start.
"""
