"""Enactors: parts that act on the scheduler beyond ordering, through the surgery verbs.

Backup copies (``speculation``), preemption (``preemption``), resources and gangs
(``gangs``): each adapts dask's state to its policy's views every ``interval`` and at the
transitions it watches, and enacts the policy's decision. Loaded only when configured.
"""
