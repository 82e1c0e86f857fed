"""Stream barriers without PyTorch on a real GPU: a CuPy process's queued work stops at the
next barrier while its gate is closed or a watched task is active, and goes on after."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

cupy = pytest.importorskip("cupy")


def _has_gpu() -> bool:
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _has_gpu(), reason="needs a CUDA GPU and CuPy"),
]

SCRIPT = textwrap.dedent(
    """
    import json, threading, time
    import cupy as cp
    from gpreempt.client.stream_barriers import StreamBarriers
    from gpreempt.control import ActivityView
    from gpreempt.control_block import ControlBlock

    own, high = ControlBlock.create(), ControlBlock.create()
    view = ActivityView(high.read_only_fd())
    a = cp.ones((4096, 4096), dtype=cp.float16)
    a @ a  # cuBLAS set up now: its first call may synchronize, which a held stream never does
    cp.cuda.Device().synchronize()  # the program's context exists: barriers may start
    barriers = StreamBarriers.start_for(own)
    deadline = time.monotonic() + 10
    while not own.barriers_on and time.monotonic() < deadline:
        time.sleep(0.01)
    barriers.watch([view.address], 1)
    own.set_window_share(0.5)  # as the daemon says: a more important task is registered

    def held_then_released(close, open_):
        close()
        safety = threading.Timer(20.0, open_)  # never leave the GPU held, whatever fails
        safety.start()
        put = barriers.barriers_put
        while barriers.barriers_put < put + 2 and time.monotonic() < deadline + 20:
            time.sleep(0.001)
        for _ in range(20):
            a @ a
        done = cp.cuda.Event()
        done.record()
        time.sleep(0.3)
        held = not done.done
        start = time.perf_counter()
        open_()
        done.synchronize()
        safety.cancel()
        return {"held": held, "after_open_ms": (time.perf_counter() - start) * 1e3}

    result = {
        "barriers_on": own.barriers_on,
        "gate": held_then_released(lambda: own.set_gate(True), lambda: own.set_gate(False)),
        "watched": held_then_released(
            lambda: high.set_requests(1), lambda: high.set_requests(0)
        ),
        "error": barriers.error,
    }
    barriers.stop()
    print(json.dumps(result))
    """
)


def test_queued_cupy_work_waits_at_the_barrier_and_goes_on_after():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["barriers_on"] and result["error"] is None
    for case in ("gate", "watched"):
        assert result[case]["held"], result  # 20 GEMMs finish in far under 300 ms unheld
        assert result[case]["after_open_ms"] < 5000, result
