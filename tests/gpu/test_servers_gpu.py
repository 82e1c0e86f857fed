"""The servers' bench workloads on a real GPU: GPT-2 `generate` and the eager ResNet-50 over
HTTP answer, and the HTTP server's requests stop a gated trainer under gpreempt."""

from __future__ import annotations

import json

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
