"""Surgery: the only code that reads or writes dask's private state.

``_internals`` for the scheduler, ``_worker_internals`` for a worker: named verbs, each
checked at start (tests/project/test_dask_boundary.py fails on a private access anywhere else).
"""
