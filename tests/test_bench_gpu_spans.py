"""A server whose request handler keeps its requests' GPU spans (``gpu_ms``, as the graph
server does) has those of the requests it served written beside their times, not those of its
warm-up; a list that does not match the requests is left out."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from gpreempt.bench import workloads


def _factory(every: int):
    """Handlers that note the number of each ``every``-th call (warm-up included) as its span."""

    def make():
        calls = 0

        def handle() -> None:
            nonlocal calls
            calls += 1
            if calls % every == 0:
                handle.gpu_ms.append(float(calls))

        handle.gpu_ms = []
        return handle

    return make


@pytest.mark.parametrize(("every", "kept"), [(1, [4.0, 5.0, 6.0]), (2, None)])
def test_the_served_requests_gpu_spans_are_kept(tmp_path: Path, monkeypatch, every, kept):
    module = ModuleType("timed_server")
    module.make = _factory(every)
    monkeypatch.setitem(sys.modules, "timed_server", module)
    (tmp_path / "arrivals.json").write_text(json.dumps([0.0, 0.002, 0.004]))
    (tmp_path / "go.json").write_text(json.dumps({"t0": time.time()}))
    out = tmp_path / "out.json"
    arrivals, go = str(tmp_path / "arrivals.json"), str(tmp_path / "go.json")
    argv = ["serve", "--fn", "timed_server:make", "--device", "cpu", "--out", str(out),
            "--warmup-requests", "3", "--warmup-s", "0", "--no-request",
            "--arrivals", arrivals, "--go-file", go]  # fmt: skip
    assert workloads.main(argv) == 0
    result = json.loads(out.read_text())
    assert len(result["start"]) == 3
    assert result.get("gpu_ms") == kept
