"""When the driver-level gate's callbacks are on, asleep or paced (``callback_mode.h``), run on
the CPU: the facts of one moment in, the mode out."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import build_gate_rule, run_gate_rule

FACTS = (
    "bound",
    "needs_launches",
    "closed",
    "watched_active",
    "kept_awake",
    "sleep_ok",
    "may_pace",
    "devices_known",
    "may_detach",
)

# Reads lines of nine 0/1 (the facts, in the order of FACTS) and prints the mode of each.
PROGRAM = r"""
#include <cstdio>
#include "callback_mode.h"
using namespace gpreempt_driver;
int main() {
  int v[9];
  while (std::scanf("%d %d %d %d %d %d %d %d %d", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                    &v[7], &v[8]) == 9) {
    ModeFacts f;
    f.bound = v[0]; f.needs_launches = v[1]; f.closed = v[2]; f.watched_active = v[3];
    f.kept_awake = v[4]; f.sleep_ok = v[5]; f.may_pace = v[6]; f.devices_known = v[7];
    f.may_detach = v[8];
    const char* names[] = {"awake", "asleep", "paced", "detached"};
    std::printf("%s\n", names[static_cast<int>(wanted_mode(f))]);
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def rule(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_gate_rule(tmp_path_factory.mktemp("mode"), PROGRAM)


def mode(binary: Path, **facts: bool) -> str:
    """The mode for ``facts`` (the others false)."""
    unknown = set(facts) - set(FACTS)
    assert not unknown, unknown
    line = " ".join(str(int(facts.get(name, False))) for name in FACTS)
    return run_gate_rule(binary, [line])[0]


def test_a_trainer_between_requests_paces_where_it_may(rule: Path) -> None:
    assert mode(rule, bound=True, may_pace=True) == "paced"
    assert mode(rule, bound=True) == "awake"


def test_a_watched_task_active_or_a_closed_gate_keeps_the_callbacks_on(rule: Path) -> None:
    """Its launches must wait (closed), or put the barriers the GPU-side check dates."""
    every = {"bound": True, "may_pace": True, "sleep_ok": True}
    assert mode(rule, **every, watched_active=True) == "awake"
    assert mode(rule, **every, closed=True) == "awake"


def test_the_daemon_lets_it_sleep_unless_a_backlog_keeps_it_awake(rule: Path) -> None:
    assert mode(rule, bound=True, sleep_ok=True, may_pace=True) == "asleep"
    assert mode(rule, bound=True, sleep_ok=True, kept_awake=True) == "awake"
    assert mode(rule, bound=True, kept_awake=True, may_pace=True) == "awake"


def test_a_server_sleeps_unless_its_launches_tell_its_activity(rule: Path) -> None:
    """A task nothing preempts: its callbacks cost it every launch, and it needs them only
    where no operator gate and no request() tell its activity."""
    assert mode(rule) == "asleep"
    assert mode(rule, kept_awake=True) == "asleep"
    assert mode(rule, needs_launches=True) == "awake"


def test_a_server_asleep_a_while_lets_cupti_go_once_its_gpus_are_known(rule: Path) -> None:
    """A subscriber slows every graph launch of its process, callbacks on or off: a task
    nothing preempts detaches CUPTI while it sleeps; it must know its GPUs first, as no context
    callback tells them once detached."""
    assert mode(rule, devices_known=True, may_detach=True) == "detached"
    assert mode(rule, may_detach=True) == "asleep"
    assert mode(rule, devices_known=True) == "asleep"


def test_a_task_that_must_wake_or_may_be_preempted_never_detaches(rule: Path) -> None:
    """Its launches must wait or tell its activity, or its barriers need the callbacks."""
    known = {"devices_known": True, "may_detach": True}
    assert mode(rule, **known, needs_launches=True) == "awake"
    assert mode(rule, **known, closed=True) == "awake"
    assert mode(rule, **known, watched_active=True) == "awake"
    assert mode(rule, **known, bound=True, sleep_ok=True) == "asleep"
