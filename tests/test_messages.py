"""Typed wire messages: what a client builds is what the daemon reads back, and a wrong field
is one clear line, whichever side reads it."""

from __future__ import annotations

import json

import pytest

from gpreempt.errors import UsageError
from gpreempt.messages import (
    ChannelRequest,
    HoldRequest,
    RegisterRequest,
    TargetRequest,
    TaskFields,
)

FULL = TaskFields(
    name="trainer",
    priority=-100,
    gpus=(0, 3),
    mechanism="gate",
    always_active=True,
    timeslice_ms=80.0,
    min_share=0.25,
    reserve_bytes=2**30,
    check=True,
)


@pytest.mark.parametrize(
    "request_",
    [
        RegisterRequest(pid=1234, task=FULL, owned=True),
        RegisterRequest(pid=1, task=TaskFields()),
        ChannelRequest(FULL),
        ChannelRequest(),
        ChannelRequest(gpu=3),
        ChannelRequest(FULL, gpu=1),
        HoldRequest("trainer", True),
        TargetRequest("evict", "1234"),
    ],
)
def test_round_trip_through_json(request_: object) -> None:
    wire = json.loads(json.dumps(request_.to_wire()))  # type: ignore[attr-defined]
    assert type(request_).from_wire(wire) == request_  # type: ignore[attr-defined]


def test_defaults_of_an_old_style_message() -> None:
    """A register message with only a pid (older clients, hand-written tools) is a task at
    priority 0 on GPU 0 with the default mechanism."""
    request = RegisterRequest.from_wire({"op": "register", "pid": 42})
    assert request.task == TaskFields() and not request.owned
    assert RegisterRequest.from_wire({"pid": 42, "priority": "high"}).task.priority == 100


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"pid": True}, "pid must be a whole number, not True"),
        ({"pid": 0}, "pid must be from 1 to"),
        ({"pid": 5, "gpus": "0"}, "gpus must be a list of 1 to 64 GPU indexes"),
        ({"pid": 5, "gpus": [-1]}, "a GPU index must be from 0 to 1023"),
        ({"pid": 5, "timeslice_ms": float("inf")}, "--timeslice-ms must be in [0.1, 600000]"),
        ({"pid": 5, "min_share": 0}, "--min-share must be in (0, 1]"),
        ({"pid": 5, "owned": "yes"}, "owned must be true or false"),
        ({"pid": 5, "name": 7}, "name must be a string, not 7"),
    ],
)
def test_a_wrong_field_is_one_clear_line(message: dict[str, object], expected: str) -> None:
    with pytest.raises(UsageError) as caught:
        RegisterRequest.from_wire(message)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_unknown_priority_names_what_is_accepted() -> None:
    with pytest.raises(ValueError, match="use high, normal, low"):
        TaskFields.from_wire({"priority": "urgent"})


def test_channel_and_target_refusals() -> None:
    with pytest.raises(UsageError, match="register must be an object of task fields"):
        ChannelRequest.from_wire({"register": [1, 2]})
    assert ChannelRequest.from_wire({"register": None}) == ChannelRequest()
    for gpu in ("1", -1, True, 1.5):
        with pytest.raises(UsageError, match="a GPU index must be"):
            ChannelRequest.from_wire({"gpu": gpu})
    for target in (True, None, 1.5, ["x"]):
        with pytest.raises(UsageError, match="target must be a task name or pid"):
            TargetRequest.from_wire({"op": "detach", "target": target})
    assert TargetRequest.from_wire({"op": "detach", "target": 77}).target == "77"
    with pytest.raises(UsageError, match="hold must be true or false"):
        HoldRequest.from_wire({"target": "x", "hold": 1})
