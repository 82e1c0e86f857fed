"""The task options of the command line: memory sizes and GPU lists."""

from __future__ import annotations

import pytest

from gpreempt.cli._task_options import parse_gpus, parse_size
from gpreempt.errors import UsageError


@pytest.mark.parametrize(
    "text, size",
    [
        ("20GiB", 20 << 30),
        ("512MiB", 512 << 20),
        ("4G", 4_000_000_000),
        ("1.5g", 1_500_000_000),
        ("1024", 1024),
        ("3kb", 3000),
        ("", 0),
        (None, 0),
    ],
)
def test_sizes(text, size) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["lots", "20 GiBs", "-1G", "G"])
def test_bad_sizes(bad) -> None:
    with pytest.raises(UsageError):
        parse_size(bad)


def test_gpu_lists(monkeypatch) -> None:
    assert parse_gpus("0,1") == (0, 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    assert parse_gpus(None) == (3,)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc")
    assert parse_gpus(None) == (0,)
    for bad in ("x", "-1", ","):
        with pytest.raises(UsageError):
            parse_gpus(bad)
