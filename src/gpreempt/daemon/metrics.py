"""Prometheus metrics of the daemon: preemptions, suspended time, latency, task states.

Names follow Prometheus conventions and label the GPU as ``gpu`` (as dcgm-exporter does)::

    gpreempt_preemptions_total{gpu,task,mechanism}     suspends performed
    gpreempt_turns_total{gpu,task}                      stops to wait for a peer's turn
    gpreempt_suspended_seconds_total{gpu,task}          time tasks spent suspended
    gpreempt_preempt_latency_seconds{gpu}               how long a suspend call took (histogram)
    gpreempt_tasks{gpu,state}                           tasks per state, now
    gpreempt_evictions_total{gpu,task}                  device memory evictions
    gpreempt_evicted_bytes_total{gpu,task}              bytes moved to host by evictions
    gpreempt_evict_seconds_total{gpu,task}              time spent evicting
    gpreempt_restores_total{gpu,task}                   restores of evicted memory
    gpreempt_restored_bytes_total{gpu,task}             bytes moved back by restores
    gpreempt_restore_seconds_total{gpu,task}            time spent restoring

Each instance has its own ``CollectorRegistry`` unless one is given, so tests and several
daemons in one process do not collide in the global registry.
"""

from __future__ import annotations

from typing import Any

#: Suspend latency buckets, seconds: 10 us to 1 s, about three per decade.
LATENCY_BUCKETS = (
    10e-6,
    25e-6,
    50e-6,
    100e-6,
    250e-6,
    500e-6,
    1e-3,
    2.5e-3,
    5e-3,
    10e-3,
    25e-3,
    50e-3,
    100e-3,
    250e-3,
    500e-3,
    1.0,
)

TASK_STATES = ("running", "suspended", "held", "evicted")


class DaemonMetrics:
    """The daemon's metrics; call the ``on_*`` methods as things happen."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.preemptions = Counter(
            "gpreempt_preemptions",
            "Suspensions of a task by gpreempt",
            ["gpu", "task", "mechanism"],
            registry=r,
        )
        self.turns = Counter(
            "gpreempt_turns",
            "Stops of a task to wait for its turn among peers of equal priority",
            ["gpu", "task"],
            registry=r,
        )
        self.suspended_seconds = Counter(
            "gpreempt_suspended_seconds",
            "Seconds tasks spent suspended (added when they resume)",
            ["gpu", "task"],
            registry=r,
        )
        self.preempt_latency = Histogram(
            "gpreempt_preempt_latency_seconds",
            "How long the mechanism's suspend call took",
            ["gpu"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tasks = Gauge(
            "gpreempt_tasks", "Registered tasks per GPU and state", ["gpu", "state"], registry=r
        )
        self.evictions = Counter(
            "gpreempt_evictions", "Device memory evictions", ["gpu", "task"], registry=r
        )
        self.evicted_bytes = Counter(
            "gpreempt_evicted_bytes",
            "Bytes of device memory moved to host by evictions",
            ["gpu", "task"],
            registry=r,
        )
        self.evict_seconds = Counter(
            "gpreempt_evict_seconds", "Seconds spent evicting", ["gpu", "task"], registry=r
        )
        self.restores = Counter(
            "gpreempt_restores", "Restores of evicted device memory", ["gpu", "task"], registry=r
        )
        self.restored_bytes = Counter(
            "gpreempt_restored_bytes",
            "Bytes moved back to the device by restores",
            ["gpu", "task"],
            registry=r,
        )
        self.restore_seconds = Counter(
            "gpreempt_restore_seconds", "Seconds spent restoring", ["gpu", "task"], registry=r
        )
        self._task_state_keys: set[tuple[str, str]] = set()
        self._server: Any = None

    def start_http(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` on ``addr:port`` from a background thread.

        Defaults to loopback: task names are visible to whoever can scrape.
        """
        from prometheus_client import start_http_server

        result = start_http_server(port, addr=addr, registry=self.registry)
        # prometheus_client >= 0.17 returns (server, thread); keep it to allow stop().
        self._server = result[0] if isinstance(result, tuple) else result

    def stop_http(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def on_suspend(self, gpu: int, task: str, mechanism: str, latency_s: float) -> None:
        self.preemptions.labels(str(gpu), task, mechanism).inc()
        if latency_s is not None and latency_s >= 0:
            self.preempt_latency.labels(str(gpu)).observe(latency_s)

    def on_turn(self, gpu: int, task: str) -> None:
        self.turns.labels(str(gpu), task).inc()

    def on_resume(self, gpu: int, task: str, suspended_s: float) -> None:
        if suspended_s > 0:
            self.suspended_seconds.labels(str(gpu), task).inc(suspended_s)

    def set_task_states(self, counts: dict[tuple[int, str], int]) -> None:
        """Replace the task-state gauge: (gpu, state) -> number of tasks.

        Pairs absent from ``counts`` that were set before drop to 0, so a state that empties
        reads 0 instead of keeping its last value.
        """
        new_keys = {(str(gpu), state) for gpu, state in counts}
        for key in self._task_state_keys - new_keys:
            self.tasks.labels(*key).set(0)
        for (gpu, state), n in counts.items():
            self.tasks.labels(str(gpu), state).set(n)
        self._task_state_keys |= new_keys

    def on_evict(self, gpu: int, task: str, bytes_moved: int, seconds: float) -> None:
        self.evictions.labels(str(gpu), task).inc()
        if bytes_moved > 0:
            self.evicted_bytes.labels(str(gpu), task).inc(bytes_moved)
        if seconds > 0:
            self.evict_seconds.labels(str(gpu), task).inc(seconds)

    def on_restore(self, gpu: int, task: str, bytes_moved: int, seconds: float) -> None:
        self.restores.labels(str(gpu), task).inc()
        if bytes_moved > 0:
            self.restored_bytes.labels(str(gpu), task).inc(bytes_moved)
        if seconds > 0:
            self.restore_seconds.labels(str(gpu), task).inc(seconds)

    def render(self) -> bytes:
        """The exposition text, as a scrape would return it."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
