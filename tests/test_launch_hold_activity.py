"""How a native launch gate follows the activity word after PyTorch's operator gate handed it
over (``launch_hold.h``: ``take_activity``, ``follow_activity_word``), run on the CPU. While a
profiler holds CUPTI the operator gate tells the activity again, so the word may move behind
the launches' back; the gate's thread adopts what it holds once its callbacks are back."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import build_gate_rule, run_gate_rule

# One process's gate and control block. Reads commands "NAME VALUE", one a line:
#   take 0      PyTorch's operator gate hands activity over: prints 1 if taken
#   word N      the operator gate writes auto_active
#   active N    the launches' own view of it (a launch raised it, or it dropped)
#   follow T    the gate's thread looks at time T: prints the launches' view and the time of
#               the last launch, from which the idle grace counts
PROGRAM = r"""
#include <cstdio>
#include <cstring>
#include "launch_hold.h"
using namespace gpreempt_words;
using namespace gpreempt_layout;
int main() {
  alignas(8) static uint8_t block[kSize] = {};
  HoldState<HoldConfig> g;
  g.cfg.auto_activity = true;
  g.cfg.torch_gate = true;
  g.ctl.store(block);
  char cmd[16];
  long long v;
  while (std::scanf("%15s %lld", cmd, &v) == 2) {
    if (!std::strcmp(cmd, "take")) {
      std::printf("%d\n", take_activity(g) ? 1 : 0);
    } else if (!std::strcmp(cmd, "word")) {
      store32(block, kOffAutoActive, static_cast<uint32_t>(v));
    } else if (!std::strcmp(cmd, "active")) {
      g.active.store(static_cast<uint32_t>(v));
    } else if (!std::strcmp(cmd, "follow")) {
      follow_activity_word(g, block, v);
      std::printf("%u %lld\n", g.active.load(), static_cast<long long>(g.last_launch_ns.load()));
    }
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def rule(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_gate_rule(tmp_path_factory.mktemp("launch_hold"), PROGRAM)


def run(binary: Path, *commands: str) -> list[str]:
    return run_gate_rule(binary, commands)


def test_a_gate_that_took_no_activity_leaves_the_word_to_the_operator_gate(rule: Path) -> None:
    assert run(rule, "word 1", "follow 5", "active 1", "word 0", "follow 6") == ["0 0", "1 0"]


def test_a_rise_told_while_cupti_was_away_is_adopted_to_drop_after_the_grace(rule: Path) -> None:
    taken, followed = run(rule, "take 0", "word 1", "follow 7000")
    assert taken == "1"
    assert followed == "1 7000"  # active, the grace counted from this look


def test_a_drop_told_while_cupti_was_away_lets_the_next_launch_raise_the_word(rule: Path) -> None:
    # active by its launches before CUPTI went; the operator gate dropped the word meanwhile
    lines = run(rule, "take 0", "active 1", "word 0", "follow 9000", "follow 9500")
    assert [line.split()[0] for line in lines[1:]] == ["0", "0"]


def test_a_word_that_agrees_is_left_as_it_is(rule: Path) -> None:
    lines = run(rule, "word 1", "take 0", "follow 100", "follow 200")
    assert lines[1] == lines[2] and lines[1].split()[0] == "1"
    assert lines[1].split()[1] != "100"  # the grace still counts from the take, not the look
