"""Prometheus metrics of the daemon: preemptions, suspended time, latency, task states.

Names follow Prometheus conventions. Series about a GPU carry ``gpu`` (its index, as
dcgm-exporter labels it) and ``UUID`` (the GPU's UUID as dcgm-exporter spells the label, so
the two join ``on(UUID)``; empty where NVML cannot tell)::

    gpreempt_build_info{version,python}                      1, the build serving
    gpreempt_preemptions_total{gpu,UUID,task,mechanism}      suspends performed
    gpreempt_suspend_failures_total{gpu,UUID,task,mechanism} suspends that failed
    gpreempt_turns_total{gpu,UUID,task}                      stops to wait for a peer's turn
    gpreempt_suspended_seconds_total{gpu,UUID,task}          time suspended, up to the scrape
    gpreempt_task_state{gpu,UUID,task,state}                 1 for the task's state now, else 0
    gpreempt_task_suspended_for_seconds{gpu,UUID,task}       length of the current suspension
    gpreempt_preempt_latency_seconds{gpu,UUID}               suspend call duration (histogram)
    gpreempt_tasks{gpu,UUID,state}                           tasks per state, now
    gpreempt_evictions_total{gpu,UUID,task}                  device memory evictions
    gpreempt_evicted_bytes_total{gpu,UUID,task}              bytes moved to host by evictions
    gpreempt_evict_seconds_total{gpu,UUID,task}              time spent evicting
    gpreempt_restores_total{gpu,UUID,task}                   restores of evicted memory
    gpreempt_restored_bytes_total{gpu,UUID,task}             bytes moved back by restores
    gpreempt_restore_seconds_total{gpu,UUID,task}            time spent restoring

Per-task series disappear when the last task of that name on that GPU ends, so a node that
runs many short jobs does not accumulate dead series. The per-task state, the suspended
time and the current suspension's length are computed at scrape time from what the daemon
last published (:meth:`DaemonMetrics.publish`), so they advance during a suspension.

Each instance has its own ``CollectorRegistry`` unless one is given, so tests and several
daemons in one process do not collide in the global registry.
"""

from __future__ import annotations

import errno
import platform
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError

#: Default port of ``gpreempt serve --metrics-port``. Prometheus's list of exporter ports
#: (9100-9999) is full, and 9400 is dcgm-exporter's, which runs on the same GPU nodes; this
#: one is outside that range, below the Kubernetes NodePort and Linux ephemeral ranges, and
#: not assigned to a common service.
DEFAULT_METRICS_PORT = 10942
#: Default bind address: loopback, since task names are visible to whoever can scrape.
DEFAULT_METRICS_ADDR = "127.0.0.1"

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

#: Every state a task can be in (task.Task.status_word); ``unprotected``: the policy wants it
#: suspended and its mechanism failed, so the more important tasks on its GPU are not
#: protected from it.
TASK_STATES = ("running", "suspended", "held", "evicted", "unprotected")


@dataclass(frozen=True)
class TaskSample:
    """What the metrics need of one task, as the daemon last published it."""

    gpu: int
    task: str
    state: str
    #: Seconds suspended in suspensions that ended.
    suspended_seconds: float
    #: ``time.monotonic()`` when the current suspension began; None while it runs.
    suspended_since: float | None


class DaemonMetrics:
    """The daemon's metrics; call the ``on_*`` methods as things happen, and :meth:`publish`
    with every task's state after each change."""

    def __init__(
        self,
        registry: Any = None,
        gpu_uuids: dict[int, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from importlib.metadata import PackageNotFoundError, version

        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        try:
            __version__ = version("gpreempt")
        except PackageNotFoundError:  # run from a source tree
            __version__ = "unknown"

        self.registry = registry if registry is not None else CollectorRegistry()
        self.gpu_uuids = dict(gpu_uuids or {})
        self._clock = clock
        self._lock = threading.Lock()
        self._published: tuple[TaskSample, ...] = ()
        r = self.registry
        self.build_info = Gauge(
            "gpreempt_build_info",
            "The gpreempt build that serves these metrics (always 1)",
            ["version", "python"],
            registry=r,
        )
        self.build_info.labels(__version__, platform.python_version()).set(1)
        self.preemptions = Counter(
            "gpreempt_preemptions",
            "Suspensions of a task by gpreempt",
            ["gpu", "UUID", "task", "mechanism"],
            registry=r,
        )
        self.suspend_failures = Counter(
            "gpreempt_suspend_failures",
            "Suspensions the policy asked for and the mechanism failed to perform",
            ["gpu", "UUID", "task", "mechanism"],
            registry=r,
        )
        self.turns = Counter(
            "gpreempt_turns",
            "Stops of a task to wait for its turn among peers of equal priority",
            ["gpu", "UUID", "task"],
            registry=r,
        )
        self.preempt_latency = Histogram(
            "gpreempt_preempt_latency_seconds",
            "How long the mechanism's suspend call took",
            ["gpu", "UUID"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tasks = Gauge(
            "gpreempt_tasks",
            "Registered tasks per GPU and state",
            ["gpu", "UUID", "state"],
            registry=r,
        )
        self.evictions = Counter(
            "gpreempt_evictions", "Device memory evictions", ["gpu", "UUID", "task"], registry=r
        )
        self.evicted_bytes = Counter(
            "gpreempt_evicted_bytes",
            "Bytes of device memory moved to host by evictions",
            ["gpu", "UUID", "task"],
            registry=r,
        )
        self.evict_seconds = Counter(
            "gpreempt_evict_seconds", "Seconds spent evicting", ["gpu", "UUID", "task"], registry=r
        )
        self.restores = Counter(
            "gpreempt_restores",
            "Restores of evicted device memory",
            ["gpu", "UUID", "task"],
            registry=r,
        )
        self.restored_bytes = Counter(
            "gpreempt_restored_bytes",
            "Bytes moved back to the device by restores",
            ["gpu", "UUID", "task"],
            registry=r,
        )
        self.restore_seconds = Counter(
            "gpreempt_restore_seconds",
            "Seconds spent restoring",
            ["gpu", "UUID", "task"],
            registry=r,
        )
        #: Label values of every per-task child, by metric, to remove them when tasks end.
        self._children: dict[Any, set[tuple[str, ...]]] = {}
        self._gpus_seen: set[int] = set()
        r.register(_TaskCollector(self))
        self._server: Any = None
        self._thread: Any = None

    # ------------------------------------------------------------------ labels
    def _gpu(self, gpu: int) -> tuple[str, str]:
        return str(gpu), self.gpu_uuids.get(gpu, "")

    def _child(self, metric: Any, *values: str) -> Any:
        self._children.setdefault(metric, set()).add(values)
        return metric.labels(*values)

    # ------------------------------------------------------------------ HTTP
    def start_http(self, port: int, addr: str = DEFAULT_METRICS_ADDR) -> None:
        """Serve ``/metrics`` on ``addr:port`` from a background thread.

        Raises UsageError, saying what to do, when the address cannot be bound (port in use,
        no such address, a privileged port without the right).
        """
        from prometheus_client import start_http_server

        try:
            result = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise UsageError(_bind_error(addr, port, exc)) from None
        # prometheus_client >= 0.17 returns (server, thread); keep it to allow stop().
        if isinstance(result, tuple):
            self._server, self._thread = result
        else:
            self._server = result

    @property
    def port(self) -> int | None:
        """The port actually bound (useful with port 0), None when not serving."""
        return None if self._server is None else int(self._server.server_address[1])

    def stop_http(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ------------------------------------------------------------------ events
    def on_suspend(self, gpu: int, task: str, mechanism: str, latency_s: float | None) -> None:
        self._child(self.preemptions, *self._gpu(gpu), task, mechanism).inc()
        if latency_s is not None and latency_s >= 0:
            self.preempt_latency.labels(*self._gpu(gpu)).observe(latency_s)

    def on_suspend_failed(self, gpu: int, task: str, mechanism: str) -> None:
        self._child(self.suspend_failures, *self._gpu(gpu), task, mechanism).inc()

    def on_turn(self, gpu: int, task: str) -> None:
        self._child(self.turns, *self._gpu(gpu), task).inc()

    def on_resume(self, gpu: int, task: str, suspended_s: float) -> None:
        """A suspension ended (the time it lasted is in the published tasks' totals)."""

    def on_evict(self, gpu: int, task: str, bytes_moved: int, seconds: float) -> None:
        self._child(self.evictions, *self._gpu(gpu), task).inc()
        if bytes_moved > 0:
            self._child(self.evicted_bytes, *self._gpu(gpu), task).inc(bytes_moved)
        if seconds > 0:
            self._child(self.evict_seconds, *self._gpu(gpu), task).inc(seconds)

    def on_restore(self, gpu: int, task: str, bytes_moved: int, seconds: float) -> None:
        self._child(self.restores, *self._gpu(gpu), task).inc()
        if bytes_moved > 0:
            self._child(self.restored_bytes, *self._gpu(gpu), task).inc(bytes_moved)
        if seconds > 0:
            self._child(self.restore_seconds, *self._gpu(gpu), task).inc(seconds)

    def on_task_end(self, gpu: int, task: str, remaining: Iterable[tuple[int, str]] = ()) -> None:
        """Drop the per-task series of ``task`` on ``gpu``, unless another task of the same
        name still runs there (``remaining``: (gpu, name) of the tasks left)."""
        if (gpu, task) in set(remaining):
            return
        prefix = (*self._gpu(gpu), task)
        for metric, children in self._children.items():
            for values in [v for v in children if v[:3] == prefix]:
                metric.remove(*values)
                children.discard(values)

    def publish(self, samples: Sequence[TaskSample]) -> None:
        """Every registered task as it is now: the per-task gauges and the suspended time
        are computed from these at each scrape, and the per-state counts set here."""
        with self._lock:
            self._published = tuple(samples)
        counts: dict[tuple[int, str], int] = {}
        for s in samples:
            counts[(s.gpu, s.state)] = counts.get((s.gpu, s.state), 0) + 1
        self._gpus_seen |= {s.gpu for s in samples}
        for gpu in sorted(self._gpus_seen):
            for state in TASK_STATES:
                self.tasks.labels(*self._gpu(gpu), state).set(counts.get((gpu, state), 0))

    def set_task_states(self, counts: dict[tuple[int, str], int]) -> None:
        """Set the per-state counts alone (without per-task samples)."""
        self._gpus_seen |= {gpu for gpu, _state in counts}
        for gpu in sorted(self._gpus_seen):
            for state in TASK_STATES:
                self.tasks.labels(*self._gpu(gpu), state).set(counts.get((gpu, state), 0))

    def render(self) -> bytes:
        """The exposition text, as a scrape would return it."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def _task_families(self) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            samples = self._published
        now = self._clock()
        labels = ["gpu", "UUID", "task"]
        suspended = CounterMetricFamily(
            "gpreempt_suspended_seconds",
            "Seconds tasks spent suspended, including the current suspension",
            labels=labels,
        )
        current = GaugeMetricFamily(
            "gpreempt_task_suspended_for_seconds",
            "How long the task's current suspension has lasted (0 while it runs)",
            labels=labels,
        )
        state = GaugeMetricFamily(
            "gpreempt_task_state",
            "1 for the state the task is in now, 0 for the others",
            labels=[*labels, "state"],
        )
        totals: dict[tuple[str, str, str], float] = {}
        ongoing: dict[tuple[str, str, str], float] = {}
        for s in samples:
            key = (*self._gpu(s.gpu), s.task)
            running_for = 0.0 if s.suspended_since is None else max(0.0, now - s.suspended_since)
            totals[key] = totals.get(key, 0.0) + s.suspended_seconds + running_for
            ongoing[key] = max(ongoing.get(key, 0.0), running_for)
            for name in TASK_STATES:
                state.add_metric([*key, name], 1.0 if s.state == name else 0.0)
        for key, total in totals.items():
            suspended.add_metric(list(key), total)
            current.add_metric(list(key), ongoing[key])
        return [suspended, current, state]


class _TaskCollector:
    """Computes the per-task families at scrape time (see :meth:`DaemonMetrics.publish`)."""

    def __init__(self, metrics: DaemonMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Any]:
        return self._metrics._task_families()

    def describe(self) -> Iterable[Any]:
        return []


def gpu_uuids() -> dict[int, str]:
    """UUID of each GPU by NVML index; empty where NVML is not available."""
    from .. import nvml

    session = nvml.open_nvml()
    if isinstance(session, nvml.NA):
        return {}
    try:
        count = session.device_count()
        if isinstance(count, nvml.NA):
            return {}
        out = {}
        for index in range(count):
            uuid = session.gpu(index, with_processes=False).uuid
            if isinstance(uuid, str):
                out[index] = uuid
        return out
    finally:
        session.close()


def _bind_error(addr: str, port: int, exc: OSError) -> str:
    where = f"{addr}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot serve metrics on {where}: the port is in use; choose another "
            "with --metrics-port"
        )
    if exc.errno == errno.EACCES:
        return (
            f"cannot serve metrics on {where}: permission denied (ports below 1024 need "
            "root); choose a port of 1024 or more"
        )
    if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return (
            f"cannot serve metrics on {where}: no such address on this machine; "
            "choose another with --metrics-addr"
        )
    reason = exc.strerror or str(exc)
    return f"cannot serve metrics on {where}: {reason}; check --metrics-addr and --metrics-port"
