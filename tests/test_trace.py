"""PyTorch Chrome trace analysis per stream, on fixtures in torch.profiler's layout."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from gpreempt.cli import main
from gpreempt.cli.analyze import trace_wrapper_argv
from gpreempt.errors import UsageError
from gpreempt.monitor import trace

FIX = Path(__file__).parent / "fixtures" / "trace"


def test_case_a_streams():
    s = trace.summarize(FIX / "case_a.json")
    assert s.gpu_events == 15
    s7, s20 = s.streams
    assert (s7.device, s7.stream, s7.kernels, s7.distinct_kernels, s7.memcpys) == (0, 7, 12, 4, 0)
    assert s7.busy_us == pytest.approx(3 * (120.5 + 10.25 + 4.0 + 30.125))
    # 3 gaps of 2 us inside each of 3 requests, 2 gaps of 500 us between them.
    assert sorted(s7.gaps) == pytest.approx([2.0] * 9 + [500.0] * 2)
    g = s7.gap_stats()
    assert (g["count"], g["p50_us"], g["max_us"]) == (11, 2.0, 500.0)
    assert s7.span_us == pytest.approx(s7.busy_us + 9 * 2.0 + 2 * 500.0)
    assert (s20.stream, s20.kernels, s20.memcpys) == (20, 0, 3)
    assert s20.busy_us == pytest.approx(24.0)
    top = s7.top_kernels(1)[0]
    assert top["name"].startswith("sm90_xmma_fprop_implicit_gemm") and top["count"] == 3
    assert top["total_us"] == pytest.approx(361.5)


def test_case_b_memsets_and_top_kernels():
    s = trace.summarize(FIX / "case_b.json")
    (st,) = s.streams
    assert (st.kernels, st.memsets, st.distinct_kernels) == (10, 2, 4)
    assert st.busy_us == pytest.approx(2 * (3.0 + 250 + 20 + 180 + 250 + 60))
    top = s.top_kernels(2)
    assert top[0]["count"] == 4 and top[0]["total_us"] == pytest.approx(1000.0)
    assert top[1]["name"].startswith("void pytorch_flash::flash_fwd_kernel")


def test_compare_two_traces():
    a = trace.summarize(FIX / "case_a.json")
    b = trace.summarize(FIX / "case_b.json")
    c = trace.compare([a, b])
    rows = {r["metric"]: r["values"] for r in c["rows"]}
    assert c["labels"] == ["Case-A", "Case-B"]
    assert rows["streams with GPU work"] == [2, 1]
    assert rows["kernels"] == [12, 10]
    assert rows["kernels shared with the others"] == [0, 0]
    assert rows["gap p50 (us)"] == [2.0, 1.5]


def test_overlapping_events_count_busy_time_once():
    ev = [
        trace.GpuEvent("kernel", "k", 0, 7, 0.0, 10.0),
        trace.GpuEvent("kernel", "k", 0, 7, 5.0, 10.0),
        trace.GpuEvent("kernel", "k", 0, 7, 20.0, 5.0),
    ]
    (st,) = trace.summarize_events(ev).streams
    assert st.busy_us == pytest.approx(20.0)
    assert st.gaps == [5.0]


def test_gzip_trace_and_bare_event_list(tmp_path):
    doc = json.loads((FIX / "case_b.json").read_text())
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert trace.summarize(gz).kernels == 10
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(doc["traceEvents"]))
    assert trace.summarize(bare).kernels == 10


def test_bad_trace_files(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        trace.summarize(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not a readable Chrome trace"):
        trace.summarize(bad)


def test_cli_json(capsys):
    rc = main(
        [
            "analyze",
            "trace",
            "--json",
            "--trace",
            str(FIX / "case_a.json"),
            "--trace",
            str(FIX / "case_b.json"),
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert [t["kernels"] for t in doc["traces"]] == [12, 10]
    assert doc["traces"][0]["streams"][0]["gaps"]["count"] == 11
    assert doc["comparison"]["labels"] == ["Case-A", "Case-B"]


def test_cli_tables(capsys):
    assert main(["analyze", "trace", "--trace", str(FIX / "case_a.json")]) == 0
    out = capsys.readouterr().out
    assert "streams" in out and "sm90_xmma_fprop" in out


def test_cli_needs_something(capsys):
    assert main(["analyze", "trace"]) == 2
    assert "nothing to analyse" in capsys.readouterr().err


def test_wrapper_command_line():
    argv = trace_wrapper_argv(["python3", "train.py", "--steps", "5"], "/tmp/t.json", 5.0, 1.0)
    assert argv[:4] == [sys.executable, "-m", "gpreempt.monitor.trace_wrapper", "/tmp/t.json"]
    assert argv[-4:] == ["--", "train.py", "--steps", "5"]
    assert trace_wrapper_argv(["-m", "pkg.mod"], "o", 1, 0)[-3:] == ["--", "-m", "pkg.mod"]
    with pytest.raises(UsageError, match="not a Python script"):
        trace_wrapper_argv(["nvidia-smi"], "o", 1, 0)


@pytest.mark.gpu
def test_trace_a_real_workload(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    script = tmp_path / "work.py"
    script.write_text(
        "import torch\n"
        "x = torch.randn(1024, 1024, device='cuda')\n"
        "for _ in range(20):\n"
        "    x = torch.relu(x @ x) / 1024\n"
        "torch.cuda.synchronize()\n"
    )
    out = tmp_path / "t.json"
    rc = main(
        [
            "analyze",
            "trace",
            "--json",
            "--out",
            str(out),
            "--duration",
            "30",
            "--",
            "python",
            str(script),
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["traces"][0]["kernels"] >= 20
