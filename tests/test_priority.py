"""Priorities: names, integers, what is refused."""

from __future__ import annotations

import pytest

from gpreempt.errors import PriorityError
from gpreempt.priority import parse_priority, priority_name


@pytest.mark.parametrize(
    "text, value",
    [
        ("high", 100),
        ("HIGH", 100),
        (" normal ", 0),
        ("low", -100),
        ("255", 255),
        ("-255", -255),
        (7, 7),
        ("0", 0),
    ],
)
def test_priorities(text, value) -> None:
    assert parse_priority(text) == value


@pytest.mark.parametrize("bad", ["urgent", "256", "-256", "1.5", "", True, None, 3.0])
def test_bad_priorities(bad) -> None:
    with pytest.raises(PriorityError):
        parse_priority(bad)


def test_priority_names() -> None:
    assert priority_name(100) == "high" and priority_name(42) == "42"
