"""The paced driver-level gate's rule (``asleep_drain.h``), run on the CPU: when a trial of
pacing (callbacks off while awake, the gate's thread putting the barriers) fails, and how long
the gate then waits before it tries again."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import build_gate_rule

# Reads lines "span MS" (a span learned: prints "long" or "ok" and the wait in ms), "fail NOW"
# (a trial failed at NOW ns: prints the first ns of the next) and "may NOW" (prints 1 where a
# trial may start at NOW ns, else 0).
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
    if (std::sscanf(line, "span %lf", &ms) == 1) {
      const bool long_ = drain.too_long(ms);
      std::printf("%s %.6f\n", long_ ? "long" : "ok", drain.wait.ms());
    } else if (std::sscanf(line, "fail %lld", &now) == 1) {
      trials.failed(now);
      std::printf("%lld\n", static_cast<long long>(trials.not_before_ns));
    } else if (std::sscanf(line, "may %lld", &now) == 1) {
      std::printf("%d\n", trials.allowed(now) ? 1 : 0);
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
    out = subprocess.run(
        [binary], input="".join(f"{x}\n" for x in lines), capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return out.stdout.split("\n")[:-1]


def spans(binary: Path, ms: list[float]) -> list[tuple[str, float]]:
    rows = run(binary, [f"span {x}" for x in ms])
    return [(verdict, float(wait)) for verdict, wait in (r.split() for r in rows)]


def test_a_process_that_keeps_pace_stays_paced(rule: Path) -> None:
    """Spans of a barrier spacing, a tenth of them five times as long (a few long kernels):
    a request would wait about half a millisecond, and the trial holds."""
    rows = spans(rule, [1.0 if i % 10 == 0 else 0.2 for i in range(1000)])
    assert {r[0] for r in rows} == {"ok"}
    assert 0.3 < rows[-1][1] < 1.0


def test_a_step_queued_at_once_fails_at_its_first_span(rule: Path) -> None:
    """A JAX or CuPy loop queues a step of GPU work in a moment of CPU: the first span the
    GPU completes is milliseconds long, and the trial fails there, not 50 spans later."""
    assert spans(rule, [8.0])[0] == ("long", pytest.approx(8.0))


def test_a_wait_over_a_millisecond_fails_and_one_under_does_not(rule: Path) -> None:
    assert spans(rule, [0.9] * 200)[-1][0] == "ok"
    assert spans(rule, [1.1] * 200)[-1][0] == "long"


def test_a_failed_trial_doubles_the_wait_for_the_next_up_to_256_s(rule: Path) -> None:
    fails = [f"fail {i * 1000 * S}" for i in range(10)]
    next_trials = [int(x) for x in run(rule, fails)]
    holds = [t - i * 1000 * S for i, t in enumerate(next_trials)]
    assert holds[:7] == [4 * S, 8 * S, 16 * S, 32 * S, 64 * S, 128 * S, 256 * S]
    assert holds[7:] == [256 * S] * 3


def test_no_trial_before_its_wait_is_over(rule: Path) -> None:
    lines = ["may 0", "fail 10", "may 11", f"may {10 + 4 * S - 1}", f"may {10 + 4 * S}"]
    assert run(rule, lines) == ["1", str(10 + 4 * S), "0", "0", "1"]
