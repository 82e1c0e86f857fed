"""The asleep driver-level gate's rule (``asleep_drain.h``), run on the CPU: when a
stream's barriers come denser and when a backlog wakes the gate, fed spans as a GPU would
report them."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import build_gate_rule, run_gate_rule

# Reads "SPAN_MS NOW_NS" lines, learns each, prints "VERDICT WAIT_MS EVERY_NS" per line; a line
# "reset" forgets what was learned.
PROGRAM = r"""
#include <cstdio>
#include <cstring>
#include "asleep_drain.h"
using namespace gpreempt_driver;
int main() {
  AsleepDrain d;
  char line[128];
  while (std::fgets(line, sizeof line, stdin)) {
    if (std::strncmp(line, "reset", 5) == 0) { d.reset(); std::printf("reset\n"); continue; }
    double ms = 0; long long now = 0;
    if (std::sscanf(line, "%lf %lld", &ms, &now) != 2) return 2;
    const AsleepVerdict v = d.learn(ms, now);
    const char* name = v == AsleepVerdict::kKeep     ? "keep"
                       : v == AsleepVerdict::kDenser ? "denser"
                                                     : "wake";
    std::printf("%s %.6f %lld\n", name, d.wait.ms(), static_cast<long long>(d.every_ns));
  }
  return 0;
}
"""

MS = 1_000_000  # ns


@pytest.fixture(scope="module")
def drain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rule compiled, as the gate compiles it, into a program of its own."""
    return build_gate_rule(tmp_path_factory.mktemp("drain"), PROGRAM)


def learn(binary: Path, spans: list[tuple[float, int] | str]) -> list[tuple[str, float, int]]:
    """Each span (GPU ms, learned at ns) fed in order; the verdict after each."""
    lines = [s if isinstance(s, str) else f"{s[0]} {s[1]}" for s in spans]
    rows = []
    for row in run_gate_rule(binary, lines):
        if row and row != "reset":
            verdict, wait, every = row.split()
            rows.append((verdict, float(wait), int(every)))
    return rows


def every(spacing_ms: float, count: int, span_ms: float, start_ns: int = MS) -> list:
    """``count`` spans of ``span_ms`` learned ``spacing_ms`` apart from ``start_ns``."""
    return [(span_ms, start_ns + int(i * spacing_ms * MS)) for i in range(count)]


def test_a_trainer_whose_gpu_keeps_up_keeps_its_spacing(drain: Path) -> None:
    rows = learn(drain, every(1.0, 500, 0.8))
    assert {r[0] for r in rows} == {"keep"}
    assert rows[-1][1] == pytest.approx(0.8)
    assert rows[-1][2] == 1 * MS


def test_long_spans_bring_denser_barriers_first(drain: Path) -> None:
    rows = learn(drain, every(1.0, 3, 4.0))
    assert [r[0] for r in rows] == ["denser", "keep", "keep"]
    assert rows[0][2] == MS // 4
    assert rows[1][1] == pytest.approx(4.0)  # learned afresh at the new spacing


def test_a_backlog_that_lasts_wakes_the_gate_after_100_ms_not_before(drain: Path) -> None:
    spans = every(0.25, 1, 3.0) + every(0.25, 600, 3.0, start_ns=2 * MS)
    rows = learn(drain, spans)
    assert rows[0][0] == "denser"
    woke = [i for i, r in enumerate(rows) if r[0] == "wake"]
    assert woke, rows[-1]
    first = spans[woke[0]][1] - spans[1][1]  # since the dense spans' wait first was too long
    assert 100 * MS <= first < 101 * MS


def test_a_queue_filling_at_a_loop_start_does_not_wake_it(drain: Path) -> None:
    """Say a loop queues 35 ms of 1.3-ms steps in 5 ms, then launches one step as each ends
    (as a JAX loop that runs ahead does): dense spans of about 2.5 ms at first, then one in
    five holds a step, the rest nothing."""
    fill = every(0.25, 1, 10.0) + every(0.25, 20, 2.5, start_ns=2 * MS)
    now = 2 * MS + 20 * MS // 4
    steady = [(1.3 if i % 5 == 0 else 0.0, now + i * MS // 4) for i in range(2000)]
    rows = learn(drain, fill + steady)
    assert "wake" not in {r[0] for r in rows}
    assert rows[-1][1] == pytest.approx(1.3)


def test_spans_of_nothing_leave_the_wait_as_it_was(drain: Path) -> None:
    """Barriers put behind the queue of a program that waits for its GPU hold no work between
    them: a request would wait for the spans that held some."""
    rows = learn(drain, every(1.0, 10, 1.5) + every(1.0, 10, 0.0, start_ns=20 * MS))
    assert rows[-1][1] == pytest.approx(rows[9][1])


def test_a_short_wait_ends_a_backlog(drain: Path) -> None:
    """The wait is an average that forgets slowly: 40 ms of 3-ms spans, then short ones that
    bring it under 2 ms about 34 ms later, then 75 ms of long ones again: neither backlog lasted
    100 ms."""
    spans = every(0.25, 1, 3.0) + every(0.25, 160, 3.0, start_ns=2 * MS)
    spans += every(0.25, 400, 0.1, start_ns=42 * MS)
    spans += every(0.25, 300, 3.0, start_ns=200 * MS)
    rows = learn(drain, spans)
    assert "wake" not in {r[0] for r in rows}
    assert min(r[1] for r in rows[161:561]) < 2.0


def test_reset_learns_afresh_at_the_first_spacing(drain: Path) -> None:
    rows = learn(drain, [*every(1.0, 2, 4.0), "reset", *every(1.0, 1, 0.5, start_ns=10 * MS)])
    assert rows[-1] == ("keep", pytest.approx(0.5), 1 * MS)
