"""The client benchmark's experiments (run them with ``python benchmarks/bench_clients.py``):

* :mod:`clients.grids` - a grid sweep of CPU work written as ``client.map``, a
  ``client.submit`` loop and ``dask.delayed``: makespan over the bound, plain dask beside the
  plugin's first run, its second run on a new cluster, and the prior's wrong guess;
* :mod:`clients.collections_` - ``dask.array`` and ``dask.dataframe`` reductions: time and
  the workers' peak memory, plain dask beside the plugin;
* :mod:`clients.search` - scikit-learn's ``GridSearchCV`` through joblib's dask backend: time
  and identical results.
"""
