"""What ``gpreempt run`` sets for the frameworks of a command that may be preempted: XLA's
command buffers off, so that a JAX trainer is held between its kernels, not whole steps."""

from __future__ import annotations

import sys

import pytest
from conftest import gpreempt

from gpreempt.client.framework_settings import framework_settings
from gpreempt.errors import UsageError
from gpreempt.priority import NAMED

LOW, HIGH = NAMED["low"], NAMED["high"]


def test_a_task_that_may_be_preempted_gets_xla_command_buffers_off() -> None:
    assert framework_settings({}, LOW) == {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="}


def test_the_users_other_xla_flags_stay() -> None:
    env = {"XLA_FLAGS": "--xla_gpu_autotune_level=2"}
    assert framework_settings(env, LOW) == {
        "XLA_FLAGS": "--xla_gpu_autotune_level=2 --xla_gpu_enable_command_buffer="
    }


def test_a_choice_of_the_user_stands() -> None:
    assert framework_settings({"XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION"}, LOW) == {}
    assert framework_settings({"GPREEMPT_XLA_COMMAND_BUFFERS": "1"}, LOW) == {}  # kept on purpose


def test_the_commands_environment_decides_not_the_callers(monkeypatch) -> None:
    monkeypatch.setenv("GPREEMPT_XLA_COMMAND_BUFFERS", "1")
    assert framework_settings({}, LOW) == {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="}


def test_a_setting_that_is_no_switch_is_one_clear_error() -> None:
    with pytest.raises(UsageError, match="GPREEMPT_XLA_COMMAND_BUFFERS"):
        framework_settings({"GPREEMPT_XLA_COMMAND_BUFFERS": "maybe"}, LOW)


def test_a_task_that_preempts_others_keeps_its_graphs() -> None:
    assert framework_settings({}, HIGH) == {}


def test_run_gives_them_to_its_command(daemon, runtime_dir) -> None:
    script = "import os; print(os.environ.get('XLA_FLAGS'))"
    low = gpreempt(runtime_dir, "run", "--priority", "low", "--", sys.executable, "-c", script)
    assert low.returncode == 0, low.stderr
    assert low.stdout.strip() == "--xla_gpu_enable_command_buffer="
    high = gpreempt(runtime_dir, "run", "--priority", "high", "--", sys.executable, "-c", script)
    assert high.stdout.strip() == "None"
