"""The HIP launch gate (``csrc/rocm/``) without a GPU: compiled against the rocprofiler-sdk
headers, then loaded by a fake rocprofiler-sdk runtime that configures the tool as the real one
does (``rocprofiler_configure``, then its initialize function) and calls its callback at the
enter phase of a HIP call.

The headers come from ``$GPREEMPT_ROCPROFILER_INCLUDE`` (``:``-separated; rocprofiler-sdk's and
HIP's and HSA's include directories), ``$ROCM_PATH/include`` or ``/opt/rocm/include``; without
them every test here skips, saying so.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gpreempt import control
from gpreempt.client.gate import rocm_build

# The fake runtime: the three rocprofiler functions the tool calls, recording what it
# configured, and entry points for the test to load the tool and call its callback.
FAKE_RUNTIME = r"""
#include <dlfcn.h>
#include <string.h>
#include <rocprofiler-sdk/registration.h>
#include <rocprofiler-sdk/rocprofiler.h>

static int in_initialize, started, n_ops, kind = -1;
static rocprofiler_tracing_operation_t ops[512];
static rocprofiler_callback_tracing_cb_t callback;
static void* callback_arg;

rocprofiler_status_t rocprofiler_create_context(rocprofiler_context_id_t* id) {
  if (!in_initialize) return ROCPROFILER_STATUS_ERROR_CONFIGURATION_LOCKED;
  id->handle = 7;
  return ROCPROFILER_STATUS_SUCCESS;
}

rocprofiler_status_t rocprofiler_configure_callback_tracing_service(
    rocprofiler_context_id_t id, rocprofiler_callback_tracing_kind_t k,
    const rocprofiler_tracing_operation_t* o, size_t n, rocprofiler_callback_tracing_cb_t cb,
    void* arg) {
  if (!in_initialize) return ROCPROFILER_STATUS_ERROR_CONFIGURATION_LOCKED;
  if (id.handle != 7 || n > 512) return ROCPROFILER_STATUS_ERROR;
  kind = (int)k;
  n_ops = (int)n;
  memcpy(ops, o, n * sizeof(*o));
  callback = cb;
  callback_arg = arg;
  return ROCPROFILER_STATUS_SUCCESS;
}

rocprofiler_status_t rocprofiler_start_context(rocprofiler_context_id_t id) {
  if (id.handle != 7) return ROCPROFILER_STATUS_ERROR_CONTEXT_NOT_FOUND;
  started = 1;
  return ROCPROFILER_STATUS_SUCCESS;
}

/* What the runtime does at registration: rocprofiler_configure, then initialize. */
int fake_load(const char* path) {
  void* tool = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!tool) return -1;
  rocprofiler_configure_func_t configure =
      (rocprofiler_configure_func_t)dlsym(tool, "rocprofiler_configure");
  if (!configure) return -2;
  rocprofiler_client_id_t client = {0, 1};
  rocprofiler_tool_configure_result_t* result = configure(ROCPROFILER_VERSION, "6.3.0", 0, &client);
  if (!result || !result->initialize) return -3;
  in_initialize = 1;
  int rc = result->initialize(0, result->tool_data);
  in_initialize = 0;
  return rc;
}

int fake_kind_ok(void) { return kind == ROCPROFILER_CALLBACK_TRACING_HIP_RUNTIME_API; }
int fake_started(void) { return started; }
int fake_traced(int op) {
  for (int i = 0; i < n_ops; ++i) if (ops[i] == op) return 1;
  return 0;
}

/* The runtime's wrapper of a HIP call: the callback at ENTER (and EXIT) of a traced one. */
int fake_call(int op, int enter) {
  if (!started || !callback || !fake_traced(op)) return 0;
  rocprofiler_callback_tracing_record_t record;
  memset(&record, 0, sizeof(record));
  record.context_id.handle = 7;
  record.kind = ROCPROFILER_CALLBACK_TRACING_HIP_RUNTIME_API;
  record.operation = op;
  record.phase = enter ? ROCPROFILER_CALLBACK_PHASE_ENTER : ROCPROFILER_CALLBACK_PHASE_EXIT;
  rocprofiler_user_data_t data = {0};
  callback(record, &data, callback_arg);
  return 1;
}

#define OP(name) if (!strcmp(s, #name)) return ROCPROFILER_HIP_RUNTIME_API_ID_##name;
int fake_op(const char* s) {
  OP(hipLaunchKernel) OP(hipLaunchKernel_spt) OP(hipModuleLaunchKernel) OP(hipExtLaunchKernel)
  OP(hipExtModuleLaunchKernel) OP(hipLaunchCooperativeKernel) OP(hipGraphLaunch)
  OP(hipGraphLaunch_spt) OP(hipMemcpyAsync) OP(hipMemcpyAsync_spt) OP(hipMemcpyHtoDAsync)
  OP(hipMemcpyDtoHAsync) OP(hipMemcpyDtoDAsync) OP(hipMemsetAsync) OP(hipMemsetAsync_spt)
  OP(hipMalloc) OP(hipStreamSynchronize) OP(hipMemcpy)
  return -1;
}
"""

HELD = (
    "hipLaunchKernel", "hipLaunchKernel_spt", "hipModuleLaunchKernel", "hipExtLaunchKernel",
    "hipExtModuleLaunchKernel", "hipLaunchCooperativeKernel", "hipGraphLaunch",
    "hipGraphLaunch_spt", "hipMemcpyAsync", "hipMemcpyAsync_spt", "hipMemcpyHtoDAsync",
    "hipMemcpyDtoHAsync", "hipMemcpyDtoDAsync", "hipMemsetAsync", "hipMemsetAsync_spt",
)  # fmt: skip
NOT_HELD = ("hipMalloc", "hipStreamSynchronize", "hipMemcpy")
EXPORTS = (
    "rocprofiler_configure", "gpreempt_driver_adopt", "gpreempt_driver_set_watch",
    "gpreempt_driver_state", "gpreempt_driver_release", "gpreempt_driver_resume",
    "gpreempt_driver_watch_version", "gpreempt_driver_initialized",
    "gpreempt_driver_take_activity",
)  # fmt: skip


def _includes() -> list[Path]:
    try:
        return rocm_build.find_include_dirs()
    except rocm_build.RocmGateUnavailable as exc:
        pytest.skip(f"the HIP launch gate cannot be built here: {exc}")


def _build(target: Path, library_dir: Path | None = None) -> Path:
    try:
        return rocm_build.build(target, _includes(), library_dir)
    except rocm_build.RocmGateUnavailable as exc:
        pytest.fail(str(exc))


def test_no_headers_is_one_line() -> None:
    with pytest.raises(rocm_build.RocmGateUnavailable, match="no rocprofiler-sdk/HIP headers"):
        rocm_build.find_include_dirs({"GPREEMPT_ROCPROFILER_INCLUDE": "/nonexistent"})


def test_the_library_compiles_and_exports_what_rocprofiler_and_the_client_call(
    tmp_path: Path,
) -> None:
    if shutil.which("nm") is None:
        pytest.skip("no nm to read the library's symbols")
    library = _build(tmp_path / "libgpreempt_rocm.so")
    defined = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout.split()
    for name in EXPORTS:
        assert name in defined, name
    undefined = subprocess.run(
        ["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout.split()
    # Of rocprofiler-sdk it calls only what the fake runtime below implements.
    assert {s for s in undefined if s.startswith("rocprofiler_")} == {
        "rocprofiler_create_context",
        "rocprofiler_configure_callback_tracing_service",
        "rocprofiler_start_context",
    }


class Loaded:
    """The tool loaded by the fake runtime, and a control block it adopted."""

    def __init__(self, tmp: Path) -> None:
        compiler = os.environ.get("CC", "gcc")
        if shutil.which(compiler) is None:
            pytest.skip(f"no C compiler ({compiler!r}) for the fake rocprofiler runtime")
        source = tmp / "fake.c"
        source.write_text(FAKE_RUNTIME)
        fake_path = tmp / "librocprofiler-sdk.so"
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-D__HIP_PLATFORM_AMD__",
             *[f"-I{d}" for d in _includes()], str(source), "-o", str(fake_path), "-ldl"],
            check=True, capture_output=True,
        )  # fmt: skip
        self.fake = ctypes.CDLL(str(fake_path), mode=ctypes.RTLD_GLOBAL)
        self.tool_path = _build(tmp / "libgpreempt_rocm.so", library_dir=tmp)
        self.loaded = self.fake.fake_load(str(self.tool_path).encode())
        self.tool = ctypes.CDLL(str(self.tool_path))  # the same copy the fake runtime opened
        self.tool.gpreempt_driver_state.restype = ctypes.c_uint32
        self.tool.gpreempt_driver_adopt.argtypes = [
            ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
            ctypes.c_double, ctypes.c_double, ctypes.c_double,
        ]  # fmt: skip
        self.memfd = os.memfd_create("gpreempt-test-control")
        os.ftruncate(self.memfd, mmap.PAGESIZE)
        self.block = mmap.mmap(self.memfd, mmap.PAGESIZE)
        self.doorbell = os.eventfd(0, os.EFD_NONBLOCK)
        # bound, publishes activity, no operator gate, 50 ms grace
        self.adopted = self.tool.gpreempt_driver_adopt(
            self.memfd, self.doorbell, 1, 1, 0, 100.0, 25.0, 50.0
        )

    def op(self, name: str) -> int:
        op = self.fake.fake_op(name.encode())
        assert op >= 0, name
        return op

    def u32(self, off: int) -> int:
        return struct.unpack_from("<I", self.block, off)[0]

    def u64(self, off: int) -> int:
        return struct.unpack_from("<Q", self.block, off)[0]

    def set_gate(self, value: int) -> None:
        struct.pack_into("<I", self.block, control.OFF_GATE_CLOSED, value)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    return Loaded(tmp_path_factory.mktemp("rocm_gate"))


def test_the_tool_traces_the_hip_launches_and_nothing_else(loaded: Loaded) -> None:
    assert loaded.loaded == 0  # the tool's initialize keeps it
    assert loaded.fake.fake_kind_ok() == 1 and loaded.fake.fake_started() == 1
    for name in HELD:
        assert loaded.fake.fake_traced(loaded.op(name)) == 1, name
    for name in NOT_HELD:
        assert loaded.fake.fake_traced(loaded.op(name)) == 0, name


def test_the_adopted_block_shows_the_gate_on(loaded: Loaded) -> None:
    assert loaded.adopted == 1
    assert loaded.tool.gpreempt_driver_state() == control.DRIVER_ON
    assert loaded.u32(control.OFF_DRIVER_GATE) == control.DRIVER_ON
    assert loaded.u32(control.OFF_GATE_INSTALLED) == 1  # bound, no operator gate


def test_launches_are_counted_at_enter_only(loaded: Loaded) -> None:
    loaded.set_gate(0)
    before = loaded.u64(control.OFF_DRIVER_LAUNCHES)
    assert loaded.fake.fake_call(loaded.op("hipLaunchKernel"), 1) == 1
    assert loaded.fake.fake_call(loaded.op("hipLaunchKernel"), 0) == 1  # exit: not a launch
    assert loaded.fake.fake_call(loaded.op("hipMemcpyAsync"), 1) == 1
    assert loaded.fake.fake_call(loaded.op("hipMalloc"), 1) == 0  # not traced
    assert loaded.u64(control.OFF_DRIVER_LAUNCHES) == before + 2


def test_a_launch_waits_while_the_gate_is_closed(loaded: Loaded) -> None:
    loaded.set_gate(control.CLOSED)
    waits = loaded.u64(control.OFF_DRIVER_WAITS)
    launches = loaded.u64(control.OFF_DRIVER_LAUNCHES)
    op = loaded.op("hipLaunchKernel")
    done = threading.Event()

    def launch() -> None:  # ctypes lets go of the GIL for the call
        loaded.fake.fake_call(op, 1)
        done.set()

    thread = threading.Thread(target=launch, daemon=True)
    thread.start()
    try:
        assert not done.wait(0.3), "the launch went through a closed gate"
        assert loaded.u64(control.OFF_DRIVER_WAITS) == waits + 1
        assert loaded.u64(control.OFF_DRIVER_LAUNCHES) == launches + 1
    finally:
        loaded.set_gate(0)  # the waiter polls its futex every millisecond
    assert done.wait(5), "the launch stayed held after the gate opened"
    thread.join(5)
    assert loaded.u64(control.OFF_DRIVER_WAIT_NS) >= 250_000_000


def test_launches_raise_activity_and_quiet_drops_it(loaded: Loaded) -> None:
    loaded.set_gate(0)
    loaded.fake.fake_call(loaded.op("hipModuleLaunchKernel"), 1)
    assert loaded.u32(control.OFF_AUTO_ACTIVE) == 1
    deadline = time.monotonic() + 5
    while loaded.u32(control.OFF_AUTO_ACTIVE) != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loaded.u32(control.OFF_AUTO_ACTIVE) == 0  # 50 ms without a launch
    assert os.eventfd_read(loaded.doorbell) >= 1  # the daemon was told
