"""What the worker tells its operators: metrics, logs, periodic readings, stalls, the dashboard.

- ``metrics.py``: every metric, in one place (``metrics_local.py``: the
  lock-free per-request counters; ``metrics_server.py``: ``/metrics``);
- ``logs.py``: text or JSON lines, never payload text by default;
- ``sampling.py``: device telemetry and consumer lag, once an interval;
- ``stalls.py``: the event loop's stalls and GC pauses, measured;
- ``dashboard/``: the terminal and PNG dashboard over Prometheus.
"""
