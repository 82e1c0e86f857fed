"""The paced driver-level gate's rule (``asleep_drain.h``), run on the CPU: when a trial of
pacing (callbacks off while awake, the gate's thread putting the barriers) fails, and how long
the gate then waits before it tries again."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import build_gate_rule, run_gate_rule

# Reads lines "span MS WALL_MS" (a span of MS of GPU work between barriers WALL_MS apart: prints
# "long" or "ok", the wait in ms and the wall time to the next barrier in ns), "fail NOW"
# (a trial failed at NOW ns: prints the first ns of the next) and "may NOW" (prints 1 where a
# trial may start at NOW ns, else 0) and "deep N SPACING_NS WINDOW_MS" (prints 1 where N paced
# marks in flight are too many, else 0).
PROGRAM = r"""
#include <cstdio>
#include <cstring>
#include "asleep_drain.h"
using namespace gpreempt_driver;
int main() {
  PacedDrain drain;
  PacedTrials trials;
  char line[128];
  while (std::fgets(line, sizeof line, stdin)) {
    double ms = 0; long long now = 0;
    double wall = 0;
    if (std::sscanf(line, "span %lf %lf", &ms, &wall) == 2) {
      const bool long_ = drain.too_long(ms, wall);
      std::printf("%s %.6f %lld\n", long_ ? "long" : "ok", drain.wait.ms(),
                  static_cast<long long>(drain.every_ns(200000)));
    } else if (std::sscanf(line, "fail %lld", &now) == 1) {
      trials.failed(now);
      std::printf("%lld\n", static_cast<long long>(trials.not_before_ns));
    } else if (std::sscanf(line, "may %lld", &now) == 1) {
      std::printf("%d\n", trials.allowed(now) ? 1 : 0);
    } else if (unsigned long n = 0; std::sscanf(line, "deep %lu %lld %lf", &n, &now, &ms) == 3) {
      std::printf("%d\n", paced_too_deep(n, now, ms) ? 1 : 0);
    } else {
      return 2;
    }
  }
  return 0;
}
"""

S = 1_000_000_000  # ns


@pytest.fixture(scope="module")
def rule(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rule compiled, as the gate compiles it, into a program of its own."""
    return build_gate_rule(tmp_path_factory.mktemp("paced"), PROGRAM)


def run(binary: Path, lines: list[str]) -> list[str]:
    return run_gate_rule(binary, lines)


def spans(binary: Path, ms: list[float], wall_ms: float = 0.2) -> list[tuple[str, float, int]]:
    """Each span of ``ms`` learned, its barriers ``wall_ms`` apart: the verdict, the wait and
    the wall time to the next barrier (at a spacing of 0.2 ms of GPU work) after each."""
    rows = run(binary, [f"span {x} {wall_ms}" for x in ms])
    return [(v, float(wait), int(every)) for v, wait, every in (r.split() for r in rows)]


def test_a_process_that_keeps_pace_stays_paced(rule: Path) -> None:
    """Spans of a barrier spacing, a tenth of them four times as long (a few long kernels): a
    request would wait about 0.4 ms, and the trial holds."""
    rows = spans(rule, [0.8 if i % 10 == 9 else 0.2 for i in range(1000)])
    assert {r[0] for r in rows} == {"ok"}
    assert 0.3 < rows[-1][1] < 0.5


def test_a_step_queued_at_once_fails_at_its_first_span(rule: Path) -> None:
    """A JAX or CuPy loop queues a step of GPU work in a moment of CPU: the first span the
    GPU completes is milliseconds long, and the trial fails there, not 50 spans later."""
    assert spans(rule, [8.0])[0][:2] == ("long", pytest.approx(8.0))


def test_a_wait_over_half_a_millisecond_fails_and_one_under_does_not(rule: Path) -> None:
    assert spans(rule, [0.45] * 200, wall_ms=1.0)[-1][0] == "ok"
    assert spans(rule, [0.55] * 200, wall_ms=1.0)[-1][0] == "long"


def test_barriers_come_closer_in_time_where_the_process_queues_faster_than_its_gpu_runs(
    rule: Path,
) -> None:
    """A process that queues 0.3 ms of GPU work in each 0.2 ms of wall time gets its barriers
    every 0.133 ms, 0.2 ms of GPU work apart; one that queues twice as fast as its GPU runs,
    at the loop's tick (0.1 ms); one that queues slower, every 0.2 ms."""
    assert spans(rule, [0.3] * 50)[-1][2] == pytest.approx(133_333, abs=10)
    assert spans(rule, [0.45] * 50)[-1][2] == 100_000
    assert spans(rule, [0.1] * 50)[-1][2] == 200_000


def test_a_failed_trial_doubles_the_wait_for_the_next_up_to_256_s(rule: Path) -> None:
    fails = [f"fail {i * 1000 * S}" for i in range(10)]
    next_trials = [int(x) for x in run(rule, fails)]
    holds = [t - i * 1000 * S for i, t in enumerate(next_trials)]
    assert holds[:7] == [4 * S, 8 * S, 16 * S, 32 * S, 64 * S, 128 * S, 256 * S]
    assert holds[7:] == [256 * S] * 3


def test_no_trial_before_its_wait_is_over(rule: Path) -> None:
    lines = ["may 0", "fail 10", "may 11", f"may {10 + 4 * S - 1}", f"may {10 + 4 * S}"]
    assert run(rule, lines) == ["1", str(10 + 4 * S), "0", "0", "1"]


def test_a_queue_twice_as_deep_as_the_window_fails_at_once(rule: Path) -> None:
    """Spans are judged once the GPU ran them, and nothing else bounds a paced queue: a
    process that queues far ahead fails as soon as its marks in flight come to more than
    twice its window (25 ms of GPU work at 0.2 ms a mark: 250 marks), before the GPU reaches
    them."""
    lines = ["deep 250 200000 25", "deep 251 200000 25", "deep 11 200000 1"]
    assert run(rule, lines) == ["0", "1", "1"]
