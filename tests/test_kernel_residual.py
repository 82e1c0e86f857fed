"""benchmarks/driver_gate/kernel_residual.py: what a request waits for of the trainer's kernel
in flight, from the Chrome trace torch.profiler exports (the profile itself needs a GPU)."""

from __future__ import annotations

import pytest
from conftest import load_script

#: A trace as torch.profiler exports it: metadata, CPU operators, runtime calls, a copy, and
#: the kernels (the only events counted).
TRACE = {
    "schemaVersion": 1,
    "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
    "traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "python3"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0,
         "dur": 40.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 12.0, "dur": 5.0},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16", "pid": 0, "tid": 7,
         "ts": 20.0, "dur": 300.0, "args": {"stream": 7, "grid": [132, 1, 1]}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "pid": 0, "tid": 7,
         "ts": 330.0, "dur": 900.0},
        {"ph": "X", "cat": "kernel", "name": "triton_per_fused_add_0", "pid": 0, "tid": 7,
         "ts": 1300.0, "dur": 100.0, "args": {"stream": 7}},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 3, "pid": 0, "tid": 7, "ts": 20.0},
    ],
}  # fmt: skip


def test_the_kernel_in_flight_weighs_by_its_length() -> None:
    """Kernels of 300 and 100 us: a random moment falls in the long one 3 times in 4, so the
    expected rest is (300^2 + 100^2) / (2 * 400) = 125 us; 3/4 of the GPU time is in the
    kernel over the 0.2 ms spacing."""
    script = load_script("benchmarks/driver_gate/kernel_residual.py")
    durations = script.kernel_durations_us(TRACE)
    assert durations == [300.0, 100.0]
    r = script.residual(durations, steps=2)
    assert r["expected_rest_us"] == pytest.approx(125.0)
    assert r["share_in_kernels_over_spacing"] == pytest.approx(0.75)
    assert (r["kernels_per_step"], r["gpu_ms_per_step"]) == (1.0, pytest.approx(0.2))
    assert (r["kernel_us_p50"], r["kernel_us_max"]) == (300.0, 300.0)
    uniform = script.residual([50.0] * 8, steps=1)
    assert uniform["expected_rest_us"] == pytest.approx(25.0)  # half a kernel, all alike
    assert uniform["share_in_kernels_over_spacing"] == 0


def test_a_profile_without_kernels_is_one_line() -> None:
    script = load_script("benchmarks/driver_gate/kernel_residual.py")
    assert script.kernel_durations_us({"traceEvents": TRACE["traceEvents"][:3]}) == []
    with pytest.raises(ValueError, match="no kernels"):
        script.residual([], steps=3)


def test_bad_arguments_are_refused(capsys) -> None:
    script = load_script("benchmarks/driver_gate/kernel_residual.py")
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--steps", "0"])
    assert exit_info.value.code == 2 and "--steps must be positive" in capsys.readouterr().err
