"""Observation: what reads the plugin and the scheduler and never steers them.

``explain`` and ``status`` (the read-only view), the dashboard page, the Prometheus metrics,
recording a trace, the forecast's snapshot and the scheduler's own forecast.
"""
