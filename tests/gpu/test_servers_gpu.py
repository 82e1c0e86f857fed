"""The servers' bench workloads on a real GPU: GPT-2 `generate` and the eager ResNet-50 over
HTTP answer, the graph server keeps its requests' GPU spans, and the HTTP server's requests
stop a gated trainer under gpreempt."""

from __future__ import annotations

import json
import time

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_gpt2_generate_answers_greedily_on_the_gpu(monkeypatch) -> None:
    pytest.importorskip("transformers")
    from gpreempt.bench import servers

    monkeypatch.setenv(servers.ENV_DEVICE, "cuda")
    handle = servers.gpt2_generate()
    first = handle()
    assert len(first) == 8 and handle() == first


def test_the_graph_server_keeps_each_requests_gpu_span() -> None:
    pytest.importorskip("torchvision")
    from gpreempt.bench.builtin_workloads import resnet50_server

    handle = resnet50_server(batch=8, graph=True)
    started = time.perf_counter()
    for _ in range(3):
        handle()
    took_ms = (time.perf_counter() - started) * 1e3
    assert len(handle.gpu_ms) == 3
    assert all(ms > 0 for ms in handle.gpu_ms) and sum(handle.gpu_ms) < took_ms


def test_the_eager_resnet_answers_over_http_on_the_gpu(monkeypatch) -> None:
    pytest.importorskip("torchvision")
    pytest.importorskip("uvicorn")
    from gpreempt.bench import servers

    monkeypatch.setenv(servers.ENV_DEVICE, "cuda")
    monkeypatch.delenv(servers.ENV_HTTP_FN, raising=False)
    handle = servers.http()
    try:
        for _ in range(5):
            assert json.loads(handle()) == {"ok": True}
    finally:
        handle.__self__.close()
