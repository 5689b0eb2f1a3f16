"""The store's cumulative histograms (fire lateness, fsync durations)."""

from __future__ import annotations

from qclient.server.store.histogram import Histogram


def test_counts_are_cumulative_per_bound_with_sum_and_count():
    h = Histogram((1, 10, 100))
    h.observe_many([0, 1, 5, 50, 500])
    h.observe(10)
    cumulative, total = h.snapshot()
    assert cumulative == [2, 4, 5, 6]  # <=1, <=10, <=100, +Inf (the count)
    assert total == 566


def test_empty_batch_changes_nothing():
    h = Histogram((1.0,))
    h.observe_many([])
    assert h.snapshot() == ([0, 0], 0)
