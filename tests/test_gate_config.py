"""The gate's one config object: its defaults, its checks, and the C++ side reading its names."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from gpreempt.client.gate.build import HEADERS, SOURCES
from gpreempt.client.gate.config import GateConfig, resolve_config
from gpreempt.errors import UsageError


def test_resolve_config_with_nothing_set_gives_the_dataclass_defaults(monkeypatch) -> None:
    """The defaults are written once: what resolve_config derives equals the field defaults."""
    for name in [name for name in os.environ if name.startswith("GPREEMPT_GATE_")]:
        monkeypatch.delenv(name)
    assert resolve_config(bound=True, auto_activity=True) == GateConfig(
        bound=True, auto_activity=True
    )


def test_a_config_with_k_set_derives_its_launch_counts(monkeypatch) -> None:
    monkeypatch.delenv("GPREEMPT_GATE_W", raising=False)
    config = resolve_config(bound=True, auto_activity=False, record_every=256)
    assert (config.window_launches, config.open_record_every) == (1024, 256)
    assert config.open_window_launches == 256 * 32


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("mode", "fast", "gate mode"),
        ("record_every", 0, "record_every must be >= 1"),
        ("window_launches", -1, "window_launches must be >= 1"),
        ("open_window_launches", 0, "open_window_launches must be >= 1"),
        ("barrier_ms", float("inf"), "barrier_ms must be a finite"),
        ("window_ms", -1.0, "must be >= 0"),
        ("poll_us", 0.0, "poll_us must be > 0"),
        ("asleep_barrier_ms", 0.0, "asleep_barrier_ms must be a finite number > 0"),
        ("asleep_max_drain_ms", float("nan"), "asleep_max_drain_ms must be a finite"),
        ("backlog_hold_s", -1.0, "backlog_hold_s must be a finite number > 0"),
    ],
)
def test_a_bad_value_is_refused_with_its_name(field, value, message) -> None:
    with pytest.raises(UsageError, match=message):
        GateConfig(bound=True, auto_activity=False, **{field: value})


def test_the_native_gate_reads_every_setting_by_its_python_name() -> None:
    """One set of names: the C++ install reads exactly GateConfig's fields, except the barrier
    spacing, which it is given by set_barriers(barrier_ms=...) once the page is kept mapped."""
    source = "\n".join(Path(path).read_text() for path in (*HEADERS, *SOURCES))
    body = source[source.index("Config config_from(") :]
    body = body[: body.index("\n}\n")]
    read = set(re.findall(r'c\.attr\("(\w+)"\)', body))
    fields = {field.name for field in dataclasses.fields(GateConfig)}
    assert read == fields - {"barrier_ms"}
    assert 'py::arg("barrier_ms")' in source
    struct = source[source.index("struct Config {") :]
    struct = struct[: struct.index("};")]
    assert set(re.findall(r"^\s+\w+ (\w+);", struct, re.MULTILINE)) == read
