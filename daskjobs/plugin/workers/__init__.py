"""The worker half: worker plugins that run inside each dask worker.

Installed by the scheduler plugin and pickled *by value* (workers need ``distributed``, not
daskjobs): a module here imports nothing of daskjobs but the worker surgery verbs.
"""
