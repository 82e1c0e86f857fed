"""The servers' bench workloads (gpreempt.bench.servers) on their CPU paths: the HTTP server
and its client in each marking, HF generate with a tiny GPT-2, the eager ResNet-50, and a
whole HTTP cell under the real daemon with a CPU stand-in for the model."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gpreempt.bench import servers

HERE = Path(__file__).parent


@pytest.fixture
def cpu_http(monkeypatch) -> None:
    pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    monkeypatch.setenv(servers.ENV_HTTP_FN, "gpreempt.bench.servers:cpu_work")


@pytest.mark.parametrize("factory", [servers.http, servers.http_unmarked, servers.http_by_hand])
def test_each_http_variant_serves_over_a_kept_alive_connection(cpu_http, factory) -> None:
    from gpreempt.bench.http_server import HttpClient

    handle = factory()
    client = handle.__self__
    assert isinstance(client, HttpClient)
    try:
        assert json.loads(handle()) == {"ok": True}
        assert json.loads(handle()) == {"ok": True}
    finally:
        client.close()
    assert client.process.poll() is not None, "the server outlived its client"


def test_an_unknown_marking_is_refused() -> None:
    from gpreempt.bench.http_server import HttpClient

    with pytest.raises(ValueError, match="marking"):
        HttpClient("gpreempt.bench.servers:cpu_work", "sometimes")


def test_generate_of_a_tiny_gpt2_is_greedy_on_the_cpu(monkeypatch) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.setenv(servers.ENV_LM, "tiny")
    monkeypatch.setenv(servers.ENV_DEVICE, "cpu")
    monkeypatch.setenv(servers.ENV_NEW_TOKENS, "4")
    handle = servers.gpt2_generate()
    first = handle()
    assert len(first) == 4 and handle() == first  # greedy: the same tokens each time


def test_a_bad_language_model_name_is_one_clear_error(monkeypatch) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from gpreempt.errors import UsageError

    monkeypatch.setenv(servers.ENV_LM, "llama")
    with pytest.raises(UsageError, match="gpt2 or tiny"):
        servers.gpt2_generate()


def test_the_eager_resnet_serves_on_the_cpu(monkeypatch) -> None:
    pytest.importorskip("torchvision")
    monkeypatch.setenv(servers.ENV_DEVICE, "cpu")
    monkeypatch.setenv(servers.ENV_BATCH, "1")
    handle = servers.resnet_eager()
    handle()


@pytest.mark.slow
def test_an_http_cell_runs_under_the_real_daemon(cpu_http, tmp_path: Path) -> None:
    """The servers group's HTTP cell, scaled down: the server's requests marked with no code
    stop a (fake) trainer, alone and co-located on the same arrivals."""
    from gpreempt.bench.runner import BenchConfig, run_bench
    from gpreempt.bench.workload_argv import Workloads

    pythonpath = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    workloads = Workloads(
        case_a_fn="gpreempt.bench.servers:http",
        case_b_fn="bench_fakes:train_factory",
        warmup_s=0.2,
        warmup_steps=3,
        env=(("PYTHONPATH", pythonpath), (servers.ENV_HTTP_FN, "gpreempt.bench.servers:cpu_work")),
    )
    config = BenchConfig(
        out_dir=tmp_path / "run",
        requests=40,
        scenarios=("gpreempt-no-request",),
        calibrate_requests=20,
        workloads=workloads,
        gpreempt=(sys.executable, "-m", "gpreempt"),
        nvml=False,
        probe_device=False,
        check_load=False,
    )
    results = run_bench(config)
    scenarios = results["scenarios"]
    assert {"a-alone", "gpreempt-no-request", "a-alone-after"} <= set(scenarios)
    assert all(scenarios[name]["valid"] for name in scenarios), scenarios
    events = (tmp_path / "run").rglob("events.jsonl")
    kinds = {json.loads(line)["event"] for path in events for line in path.read_text().splitlines()}
    assert "suspend" in kinds, "the trainer was never stopped: the requests were not marked"
