"""The Grafana dashboard's curves as a PNG, drawn from a real Prometheus.

The folder tells the story: ``panels`` reads the panels' titles, units and
PromQL from ``ops/grafana/dashboards/pipeline.json``; ``prometheus`` runs and
queries a Prometheus; ``series`` fetches each panel's curves through
``query_range``; ``render`` draws them; ``record`` makes a real run (a
worker, traffic with an overload burst, a Prometheus scraping it) to draw.
``pipeline dashboard --help`` is the command line.
"""

from pipeline.observability.dashboard.panels import (
    DEFAULT_PANELS,
    Panel,
    Target,
    load_panels,
    promql,
)
from pipeline.observability.dashboard.prometheus import (
    LocalPrometheus,
    PrometheusClient,
    scrape_config,
)
from pipeline.observability.dashboard.render import figure, render
from pipeline.observability.dashboard.series import Curves, Series, dump, fetch, load

__all__ = [
    "DEFAULT_PANELS",
    "Curves",
    "LocalPrometheus",
    "Panel",
    "PrometheusClient",
    "Series",
    "Target",
    "dump",
    "fetch",
    "figure",
    "load",
    "load_panels",
    "promql",
    "render",
    "scrape_config",
]
