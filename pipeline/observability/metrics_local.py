"""Counters and histograms without a lock, for the metrics recorded per request.

prometheus_client's ``Counter.inc`` and ``Histogram.observe`` take a lock per
call (a histogram's sum and its bucket one each) and scan the buckets in
Python; paid three or four times for every input, that was about 6% of a
no-op worker's GIL time. :class:`LocalCounter` and :class:`LocalHistogram`
keep their values in plain dicts instead, and :class:`LocalFamilies`, a
collector in the worker's registry, turns them into metric families whenever
the registry is collected (a ``/metrics`` scrape, ``get_sample_value``): a
reader sees every count made so far, and nobody flushes anything.

Promises and their limits:

- one thread writes (the worker's event loop, the only caller of the
  per-request methods of :class:`~pipeline.observability.metrics.PipelineMetrics`); two
  threads writing the same family at once could lose an increment;
- any thread may collect while that one writes: each family is read from a
  copy of its dict and of each child's counts, taken in C with the GIL held,
  so a scrape never fails for a concurrent write; a histogram's sum may lag
  its buckets by the one observation in progress (prometheus_client's own
  histogram, one lock for its sum and one per bucket, has a like gap);
- the families expose what prometheus_client's ``Counter`` and ``Histogram``
  would for the same calls, sample for sample and value for value (float
  sums added in the same order), names, labels, ``le`` strings and help text
  included (``tests/unit/observability/test_metrics_local.py`` diffs the text exposition),
  with no ``_created`` series (the pipeline disables them).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

__all__ = ["LocalCounter", "LocalFamilies", "LocalHistogram"]

# A child's label values, in the order of the family's label names.
Key = tuple[str, ...]


class LocalCounter:
    """A counter family: ``inc(key)`` adds one to the child ``key`` (label values)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._counts: dict[Key, int] = {}

    def touch(self, key: Key) -> None:
        """Create the child ``key`` at zero (a series before its first event)."""
        self._counts.setdefault(key, 0)

    def inc(self, key: Key) -> None:
        counts = self._counts
        try:
            counts[key] += 1
        except KeyError:
            counts[key] = 1

    def family(self) -> CounterMetricFamily:
        fam = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, n in self._counts.copy().items():
            fam.add_metric(key, float(n))
        return fam


class LocalHistogram:
    """A histogram family: ``observe(key, value)`` records ``value`` in the child ``key``.

    ``buckets`` are the upper bounds, sorted; ``+Inf`` is added when missing,
    as prometheus_client does.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Iterable[float],
        labelnames: Sequence[str] = (),
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError(f"{name}: buckets not in sorted order")
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._bounds = tuple(bounds)
        self._le = tuple(floatToGoString(b) for b in bounds)  # type: ignore[no-untyped-call]
        # Per child: one count per bucket (not cumulative), then the sum.
        self._children: dict[Key, list[float]] = {}

    def touch(self, key: Key) -> list[float]:
        """The child ``key``, created empty when new (a series before its first event)."""
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = [0.0] * (len(self._bounds) + 1)
        return child

    def observe(self, key: Key, value: float) -> None:
        child = self._children.get(key)
        if child is None:
            child = self.touch(key)
        # The first bound >= value: the bucket whose `le` takes it.
        child[bisect_left(self._bounds, value)] += 1.0
        child[-1] += value

    def family(self) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in self._children.copy().items():
            counts = child.copy()
            cumulative = 0.0
            buckets = []
            for le, n in zip(self._le, counts[:-1], strict=True):
                cumulative += n
                buckets.append((le, cumulative))
            fam.add_metric(key, buckets, counts[-1])
        return fam


class LocalFamilies:
    """The collector of some local families, registered in ``registry`` at creation.

    Its families are exposed in the order given, at the place in the
    registry's order where it was registered.
    """

    def __init__(
        self, families: Sequence[LocalCounter | LocalHistogram], registry: CollectorRegistry
    ) -> None:
        self._families = tuple(families)
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        for local in self._families:
            yield local.family()

    def describe(self) -> Iterator[Metric]:
        """The families' names, for the registry's duplicate check and name filters."""
        for local in self._families:
            kind = CounterMetricFamily if isinstance(local, LocalCounter) else HistogramMetricFamily
            yield kind(local.name, local.documentation, labels=local.labelnames)
