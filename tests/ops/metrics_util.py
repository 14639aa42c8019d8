"""Reading one value from a live /metrics page (tests)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape_value(url: str, metric: str, **labels: str) -> float:
    """Sum of the samples named ``metric`` whose labels include ``labels``."""
    text = httpx.get(url + "/metrics", timeout=10).text
    want = set(labels.items())
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == metric and want <= set(s.labels.items()))
