"""scikit-learn's ``GridSearchCV`` through joblib's dask backend, plain dask beside the plugin:
time of the search, and its results (identical, as a model search must be)."""

from __future__ import annotations

import time
from typing import Any

from distributed import Client, LocalCluster

import daskjobs

WORKERS, THREADS = 2, 1


def search(quick: bool, pre_dispatch: str = "2*n_jobs") -> Any:
    import numpy as np
    from sklearn.datasets import make_classification
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    n = 600 if quick else 1_500
    x, y = make_classification(n_samples=n, n_features=20, random_state=0)
    grid = {"C": list(np.logspace(-2, 2, 5 if quick else 8)), "gamma": [0.01, 0.1, 1.0]}
    return GridSearchCV(SVC(), grid, cv=3, n_jobs=-1, pre_dispatch=pre_dispatch), x, y


def run(plugin: bool, quick: bool, pre_dispatch: str = "2*n_jobs") -> tuple[float, Any]:
    """Seconds of ``fit`` under joblib's dask backend, and the mean test scores."""
    import joblib

    kwargs: dict[str, Any] = dict(
        n_workers=WORKERS, threads_per_worker=THREADS, processes=True, dashboard_address=":0"
    )
    cluster = daskjobs.local_cluster(**kwargs) if plugin else LocalCluster(**kwargs)
    with cluster, Client(cluster) as client:
        client.wait_for_workers(WORKERS)
        gs, x, y = search(quick, pre_dispatch)
        warm, wx, wy = search(True, pre_dispatch)  # the workers' imports, outside the time
        with joblib.parallel_backend("dask"):
            warm.fit(wx[:200], wy[:200])
        t0 = time.perf_counter()
        with joblib.parallel_backend("dask"):
            gs.fit(x, y)
        seconds = time.perf_counter() - t0
    return seconds, list(gs.cv_results_["mean_test_score"])
