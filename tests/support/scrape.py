"""Reading a running worker's Prometheus metrics in a test."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["counter_by"]


def counter_by(port: int, sample: str, label: str) -> dict[str, float]:
    """The values of ``sample`` (e.g. ``pipeline_lane_offsets_passed_total``) on the
    worker's ``/metrics`` at ``port``, by the value of its ``label``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        s.labels[label]: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == sample
    }
