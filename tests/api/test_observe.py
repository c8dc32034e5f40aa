"""api.observe: batched metrics add up to what unbatched ones would."""

import random

from prometheus_client import CollectorRegistry, Histogram

from api.observe import HistogramBatch, Metrics


def _samples(histogram: Histogram) -> dict:
    registry = CollectorRegistry()
    registry.register(histogram)
    samples = registry.collect()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in samples
        for s in m.samples
        if "created" not in s.name
    }


def test_a_flushed_batch_equals_the_same_observations_one_by_one():
    """Pins the prometheus_client internals HistogramBatch writes to."""
    buckets = (0.001, 0.01, 0.1, 1.0)
    direct = Histogram("direct", "d", buckets=buckets, registry=None)
    batched = Histogram("direct", "d", buckets=buckets, registry=None)
    batch = HistogramBatch((*buckets, float("inf")))
    values = [random.choice([0.0005, 0.001, 0.005, 0.1, 0.5, 3.0]) for _ in range(500)]
    for value in values:
        direct.observe(value)
        batch.observe(value)
    batch.flush_into(batched)
    assert _samples(batched) == _samples(direct)
    batch.flush_into(batched)  # a flush empties the batch
    assert _samples(batched) == _samples(direct)


def test_metrics_count_requests_once_flushed():
    metrics = Metrics()
    for _ in range(3):
        metrics.count_request("document", "GET", 200, 0.002)
    metrics.observe_redis("pipeline", 0.001, "timeout")
    metrics.flush()
    metrics.flush()
    assert metrics.requests.labels("document", "GET", "200")._value.get() == 3
    assert metrics.redis_errors.labels("timeout")._value.get() == 1
