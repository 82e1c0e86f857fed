"""The control block's layout is defined once (``gpreempt/control.py``); the C++ gates read it
from ``control_layout.h``, which must agree with it in every constant."""

from __future__ import annotations

import re
from pathlib import Path

from gpreempt import control

HEADER = (
    Path(control.__file__).parent / "client" / "gate" / "csrc" / "control_layout.h"
).read_text()

#: C++ name -> Python name, for the constants whose names differ beyond their spelling.
RENAMED = {
    "kSize": "SIZE",
    "kOffInstalled": "OFF_GATE_INSTALLED",
    "kClosed": "CLOSED",
    "kDriverNone": "DRIVER_NONE",
    "kDriverOn": "DRIVER_ON",
    "kDriverUnavailable": "DRIVER_UNAVAILABLE",
    "kDriverReleased": "DRIVER_RELEASED",
    "kDriverFailed": "DRIVER_FAILED",
}


def _python_name(cpp: str) -> str:
    if cpp in RENAMED:
        return RENAMED[cpp]
    words = re.findall(r"[A-Z][a-z0-9]*", cpp[len("kOff") :])
    return "OFF_" + "_".join(w.upper() for w in words)


def header_constants() -> dict[str, int]:
    return {
        name: int(value)
        for name, value in re.findall(
            r"constexpr\s+(?:size_t|uint32_t)\s+(k\w+)\s*=\s*(\d+)\s*;", HEADER
        )
    }


def test_every_header_constant_matches_control_py() -> None:
    constants = header_constants()
    assert len(constants) >= 27
    for cpp, value in constants.items():
        name = _python_name(cpp)
        assert getattr(control, name) == value, f"{cpp} = {value}, control.{name}"


def test_every_offset_of_control_py_is_in_the_header() -> None:
    in_header = {_python_name(c) for c in header_constants()}
    offsets = {n for n in dir(control) if n.startswith("OFF_")}
    assert offsets <= in_header, offsets - in_header


def test_words_do_not_overlap_and_fit() -> None:
    widths = {n: 8 if n in _U64_WORDS else 4 for n in dir(control) if n.startswith("OFF_")}
    spans = sorted((getattr(control, n), getattr(control, n) + w) for n, w in widths.items())
    for (_a, end), (start, _b) in zip(spans, spans[1:], strict=False):
        assert end <= start
    assert spans[-1][1] <= control.SIZE


_U64_WORDS = {
    "OFF_LAUNCHES",
    "OFF_WAITS",
    "OFF_WAIT_NS",
    "OFF_DRIVER_LAUNCHES",
    "OFF_DRIVER_WAITS",
    "OFF_DRIVER_WAIT_NS",
    "OFF_DRIVER_BARRIERS",
    "OFF_DEVICES",
}
