"""DaemonMetrics: names, labels, buckets, and the scrape text."""

from __future__ import annotations

import urllib.request

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gpreempt.daemon.metrics import LATENCY_BUCKETS, DaemonMetrics  # noqa: E402


def samples(m: DaemonMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_suspend_resume_counts_and_latency():
    m = DaemonMetrics()
    m.on_suspend(0, "train", "driver_lock", 0.0021)
    m.on_suspend(0, "train", "driver_lock", 0.0004)
    m.on_suspend(1, "etl", "signal", 0.00002)
    m.on_turn(0, "train")  # waiting for a peer's turn is not a preemption
    m.on_resume(0, "train", 1.5)
    m.on_resume(0, "train", 0.25)
    s = samples(m)
    assert s[("gpreempt_turns_total", (("gpu", "0"), ("task", "train")))] == 1
    key = (("gpu", "0"), ("mechanism", "driver_lock"), ("task", "train"))
    assert s[("gpreempt_preemptions_total", key)] == 2
    assert s[("gpreempt_suspended_seconds_total", (("gpu", "0"), ("task", "train")))] == 1.75
    assert s[("gpreempt_preempt_latency_seconds_count", (("gpu", "0"),))] == 2
    assert s[("gpreempt_preempt_latency_seconds_sum", (("gpu", "0"),))] == pytest.approx(0.0025)
    assert s[("gpreempt_preempt_latency_seconds_bucket", (("gpu", "0"), ("le", "0.0005")))] == 1
    assert s[("gpreempt_preempt_latency_seconds_bucket", (("gpu", "1"), ("le", "2.5e-05")))] == 1


def test_buckets_span_10us_to_1s():
    assert LATENCY_BUCKETS[0] == pytest.approx(10e-6)
    assert LATENCY_BUCKETS[-1] == 1.0
    assert list(LATENCY_BUCKETS) == sorted(LATENCY_BUCKETS)


def test_task_states_replace_previous_values():
    m = DaemonMetrics()
    m.set_task_states({(0, "running"): 2, (0, "suspended"): 1})
    m.set_task_states({(0, "running"): 3})
    s = samples(m)
    assert s[("gpreempt_tasks", (("gpu", "0"), ("state", "running")))] == 3
    assert s[("gpreempt_tasks", (("gpu", "0"), ("state", "suspended")))] == 0


def test_evict_and_restore():
    m = DaemonMetrics()
    m.on_evict(0, "train", 1_200_000_000, 0.67)
    m.on_restore(0, "train", 1_200_000_000, 0.39)
    s = samples(m)
    lab = (("gpu", "0"), ("task", "train"))
    assert s[("gpreempt_evictions_total", lab)] == 1
    assert s[("gpreempt_evicted_bytes_total", lab)] == 1.2e9
    assert s[("gpreempt_restores_total", lab)] == 1
    assert s[("gpreempt_restored_bytes_total", lab)] == 1.2e9
    assert s[("gpreempt_restore_seconds_total", lab)] == pytest.approx(0.39)


def test_instances_do_not_share_a_registry():
    a, b = DaemonMetrics(), DaemonMetrics()
    a.on_suspend(0, "x", "signal", 0.001)
    assert (
        "gpreempt_preemptions_total",
        (("gpu", "0"), ("mechanism", "signal"), ("task", "x")),
    ) not in samples(b)


def test_http_endpoint():
    m = DaemonMetrics()
    m.on_suspend(0, "train", "gate", 0.0001)
    m.start_http(0)  # port 0: any free port
    try:
        port = m._server.server_address[1]
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        assert b"gpreempt_preemptions_total" in body
    finally:
        m.stop_http()
