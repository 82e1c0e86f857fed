"""DaemonMetrics: names, labels, buckets, and the scrape text."""

from __future__ import annotations

import urllib.request

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gpreempt.daemon.prometheus import (  # noqa: E402
    DEFAULT_METRICS_PORT,
    LATENCY_BUCKETS,
    DaemonMetrics,
    TaskSample,
)
from gpreempt.errors import UsageError  # noqa: E402

G0 = (("UUID", ""), ("gpu", "0"))  # no NVML here: the UUID label is empty


def samples(m: DaemonMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return Samples(out)


class Samples(dict):
    """Samples by (name, labels); a key's labels may come in any order."""

    def __getitem__(self, key):
        name, labels = key
        return super().__getitem__((name, tuple(sorted(labels))))


def test_suspend_resume_counts_and_latency():
    m = DaemonMetrics()
    m.on_suspend(0, "train", "driver_lock", 0.0021)
    m.on_suspend(0, "train", "driver_lock", 0.0004)
    m.on_suspend(1, "etl", "signal", 0.00002)
    m.on_turn(0, "train")  # waiting for a peer's turn is not a preemption
    s = samples(m)
    assert s[("gpreempt_turns_total", (*G0, ("task", "train")))] == 1
    key = (*G0, ("mechanism", "driver_lock"), ("task", "train"))
    assert s[("gpreempt_preemptions_total", key)] == 2
    assert s[("gpreempt_preempt_latency_seconds_count", G0)] == 2
    assert s[("gpreempt_preempt_latency_seconds_sum", G0)] == pytest.approx(0.0025)
    assert s[("gpreempt_preempt_latency_seconds_bucket", (*G0, ("le", "0.0005")))] == 1
    g1 = (("UUID", ""), ("gpu", "1"), ("le", "2.5e-05"))
    assert s[("gpreempt_preempt_latency_seconds_bucket", g1)] == 1


def test_buckets_span_10us_to_1s():
    assert LATENCY_BUCKETS[0] == pytest.approx(10e-6)
    assert LATENCY_BUCKETS[-1] == 1.0
    assert list(LATENCY_BUCKETS) == sorted(LATENCY_BUCKETS)


def test_task_states_replace_previous_values():
    m = DaemonMetrics()
    m.set_task_states({(0, "running"): 2, (0, "suspended"): 1})
    m.set_task_states({(0, "running"): 3})
    s = samples(m)
    assert s[("gpreempt_tasks", (*G0, ("state", "running")))] == 3
    assert s[("gpreempt_tasks", (*G0, ("state", "suspended")))] == 0
    assert s[("gpreempt_tasks", (*G0, ("state", "unprotected")))] == 0


def test_evict_and_restore():
    m = DaemonMetrics()
    m.on_evict(0, "train", 1_200_000_000, 0.67)
    m.on_restore(0, "train", 1_200_000_000, 0.39)
    s = samples(m)
    lab = (*G0, ("task", "train"))
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
        (*G0, ("mechanism", "signal"), ("task", "x")),
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


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_suspended_seconds_advance_during_a_suspension():
    clock = Clock()
    m = DaemonMetrics(clock=clock)
    lab = (*G0, ("task", "train"))
    m.publish([TaskSample(0, "train", "suspended", 1.5, suspended_since=clock.now)])
    clock.now += 4.0  # still suspended at the scrape: the counter already counts it
    s = samples(m)
    assert s[("gpreempt_suspended_seconds_total", lab)] == pytest.approx(5.5)
    assert s[("gpreempt_task_suspended_for_seconds", lab)] == pytest.approx(4.0)
    assert s[("gpreempt_task_state", (*lab, ("state", "suspended")))] == 1
    assert s[("gpreempt_task_state", (*lab, ("state", "running")))] == 0
    m.publish([TaskSample(0, "train", "running", 5.5, suspended_since=None)])
    clock.now += 10.0
    s = samples(m)
    assert s[("gpreempt_suspended_seconds_total", lab)] == pytest.approx(5.5)
    assert s[("gpreempt_task_suspended_for_seconds", lab)] == 0
    assert s[("gpreempt_task_state", (*lab, ("state", "running")))] == 1


def test_series_of_an_ended_task_are_removed():
    m = DaemonMetrics()
    m.on_suspend(0, "train", "signal", 0.001)
    m.on_suspend_failed(0, "train", "gate")
    m.on_evict(0, "train", 10, 0.1)
    m.on_suspend(0, "serve", "signal", 0.001)
    m.publish([TaskSample(0, "train", "running", 0.0, None)])
    m.on_task_end(0, "train", remaining=[(0, "serve")])
    m.publish([])
    text = m.render().decode()
    assert 'task="train"' not in text
    assert 'task="serve"' in text
    # another live task of the same name on that GPU keeps the series
    m.on_suspend(0, "serve", "signal", 0.001)
    m.on_task_end(0, "serve", remaining=[(0, "serve")])
    assert 'task="serve"' in m.render().decode()


def test_failures_build_info_and_gpu_uuid():
    m = DaemonMetrics(gpu_uuids={0: "GPU-1234"})
    m.on_suspend_failed(0, "train", "gate")
    m.on_suspend_failed(0, "train", "gate")
    m.publish([TaskSample(0, "train", "unprotected", 0.0, None)])
    s = samples(m)
    lab = (("UUID", "GPU-1234"), ("gpu", "0"))
    assert (
        s[("gpreempt_suspend_failures_total", (*lab, ("mechanism", "gate"), ("task", "train")))]
        == 2
    )
    assert s[("gpreempt_tasks", (*lab, ("state", "unprotected")))] == 1
    assert s[("gpreempt_task_state", (*lab, ("state", "unprotected"), ("task", "train")))] == 1
    info = [k for k in s if k[0] == "gpreempt_build_info"]
    assert len(info) == 1 and dict(info[0][1])["version"]


def test_busy_port_is_one_clear_error():
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UsageError, match=f"127.0.0.1:{port}: the port is in use"):
            DaemonMetrics().start_http(port)


def test_default_port_is_not_a_known_exporters():
    # 9400: dcgm-exporter; 9100-9999: Prometheus's allocated exporter range
    assert not 9090 <= DEFAULT_METRICS_PORT <= 9999
