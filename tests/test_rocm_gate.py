"""The launch gate's ROCm path, on a CPU: its stream barriers through a fake HIP runtime that
records each call and refuses what HIP refuses (a device without stream waits, a read-only page,
memory other than signal memory where CLR takes only that), and the HIP declarations it relies
on checked against HIP's own headers."""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpreempt import control
from gpreempt.client.gate.build import HEADERS, SOURCES

OFFSETS = {
    "gate_closed": control.OFF_GATE_CLOSED,
    "requests": control.OFF_REQUESTS,
    "auto_active": control.OFF_AUTO_ACTIVE,
    "hinted": control.OFF_HINTED,
}

CSRC = Path(__file__).resolve().parent.parent / "src" / "gpreempt" / "client" / "gate" / "csrc"
#: The file of the gate's stream barriers through HIP.
HIP_BARRIERS = CSRC / "operator_gate_barriers_hip.cpp"
#: Where HIP's headers are: $GPREEMPT_HIP_INCLUDE, else ROCm's, else the distribution's.
HIP_INCLUDE = next(
    (
        Path(d)
        for d in (os.environ.get("GPREEMPT_HIP_INCLUDE", ""), "/opt/rocm/include", "/usr/include")
        if d and (Path(d) / "hip" / "hip_runtime_api.h").exists()
    ),
    Path("/usr/include"),
)
HIP_HEADER = HIP_INCLUDE / "hip" / "hip_runtime_api.h"
DEVICE_OFFSET = 0x100000000000  # the fake's device address = host address + this

# Each refusal is HIP's (CLR hipamd/src/hip_stream_ops.cpp, ihipStreamOperation; KFD user
# pointers are pinned writable, so hipHostRegister of a read-only page fails).
FAKE_HIP = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static FILE* out(void) {
  static FILE* f;
  if (!f) { f = fopen(getenv("FAKE_HIP_LOG"), "a"); setvbuf(f, NULL, _IONBF, 0); }
  return f;
}
/* whether the page at `p` is mapped writable (/proc/self/maps) */
static int writable(void* p) {
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[512];
  int w = 0;
  while (maps && fgets(line, sizeof line, maps)) {
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && (unsigned long)p >= lo &&
        (unsigned long)p < hi) {
      w = perms[1] == 'w';
      break;
    }
  }
  if (maps) fclose(maps);
  return w;
}
int hipStreamWaitValue32(void* stream, void* ptr, uint32_t value, unsigned flags, uint32_t mask) {
  /* GPU_STREAMOPS_CP_WAIT (or an older CLR): only hipMallocSignalMemory memory */
  if (getenv("FAKE_HIP_SIGNAL_ONLY")) return 1; /* hipErrorInvalidValue */
  fprintf(out(), "wait %lu %lu %u %u %u\n", (unsigned long)stream, (unsigned long)ptr, value,
          flags, mask);
  return 0;
}
int hipHostRegister(void* host, size_t bytes, unsigned flags) {
  fprintf(out(), "register %lu %zu %u\n", (unsigned long)host, bytes, flags);
  return writable(host) ? 0 : 2; /* hipErrorOutOfMemory: the pages cannot be pinned */
}
int hipHostGetDevicePointer(void** device, void* host, unsigned flags) {
  *device = (char*)host + 0x100000000000UL;
  fprintf(out(), "device %lu %u\n", (unsigned long)host, flags);
  return 0;
}
int hipGetDevice(int* device) { *device = 0; return 0; }
int hipDeviceGetAttribute(int* value, int attribute, int device) {
  const char* support = getenv("FAKE_HIP_WAIT_VALUE");
  if (attribute != 10013) return 1;
  if (support && strcmp(support, "unknown") == 0) return 1; /* an attribute it predates */
  *value = support ? atoi(support) : 1;
  return 0;
}
"""


@pytest.fixture(scope="module")
def native():
    pytest.importorskip("torch")
    from gpreempt.client.gate.build import NativeGateUnavailable, load_native

    try:
        return load_native()
    except NativeGateUnavailable as exc:
        pytest.skip(f"the gate extension cannot be built here: {exc}")


@pytest.fixture
def fake_hip(tmp_path, monkeypatch) -> tuple[Path, Path]:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the fake HIP runtime")
    source = tmp_path / "fake_hip.c"
    source.write_text(FAKE_HIP)
    library = tmp_path / "libfakehip.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_HIP_LOG", str(log))
    return library, log


class Block:
    """A page standing in for a control block (the gate only reads words of it); a watched
    block is mapped read-only, as the daemon's descriptors allow."""

    def __init__(self, hinted: bool = False, read_only: bool = False) -> None:
        self.page = mmap.mmap(-1, mmap.PAGESIZE)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.page))
        ctypes.c_uint32.from_address(self.address + OFFSETS["hinted"]).value = int(hinted)
        if read_only:
            libc = ctypes.CDLL(None, use_errno=True)
            assert libc.mprotect(ctypes.c_void_p(self.address), mmap.PAGESIZE, 1) == 0  # PROT_READ

    def device(self, field: str) -> int:
        return self.address + OFFSETS[field] + DEVICE_OFFSET


def calls(log: Path) -> list[tuple[str, ...]]:
    return [tuple(line.split()) for line in log.read_text().splitlines()]


def waits(log: Path) -> list[tuple[int, int, int, int, int]]:
    return [tuple(int(x) for x in c[1:]) for c in calls(log) if c[0] == "wait"]  # type: ignore[misc]


def test_offsets_match_the_gate() -> None:
    # the fake blocks above place words where control.py says; the gate's layout must agree
    source = (CSRC / "control_layout.h").read_text()
    for field, name in (
        ("gate_closed", "GateClosed"),
        ("requests", "Requests"),
        ("auto_active", "AutoActive"),
        ("hinted", "Hinted"),
    ):
        assert f"kOff{name} = {OFFSETS[field]};" in source
    assert '#include "control_layout.h"' in (CSRC / "operator_gate_base.h").read_text()


def test_barrier_waits_on_a_complete_watch_list(native, fake_hip) -> None:
    library, log = fake_hip
    own, plain, hinted = Block(), Block(), Block(hinted=True)
    stream = 0x5000
    pages, fallbacks = native._hip_waits_for_test(
        str(library), stream, own.address, [plain.address, hinted.address], 3
    )
    assert (pages, fallbacks) == (3, 0)
    all_bits = 0xFFFFFFFF
    # own word: bit 0 (a plain close) clear, so a close-while-watched word (2V) lets it pass;
    # each watched task: no request, and for one that never used request(), no automatic activity
    assert waits(log) == [
        (stream, own.device("gate_closed"), 0, 1, 1),
        (stream, plain.device("requests"), 0, 1, all_bits),
        (stream, plain.device("auto_active"), 0, 1, all_bits),
        (stream, hinted.device("requests"), 0, 1, all_bits),
    ]
    registered = [c for c in calls(log) if c[0] == "register"]
    # each page once, 4 KiB, mapped and portable (hipHostRegisterMapped | hipHostRegisterPortable)
    assert [(int(c[1]), int(c[2]), int(c[3])) for c in registered] == [
        (b.address, 4096, 3) for b in (own, plain, hinted)
    ]


def test_barrier_waits_for_an_open_gate_without_a_complete_list(native, fake_hip) -> None:
    library, log = fake_hip
    own, watched = Block(), Block()
    native._hip_waits_for_test(str(library), 7, own.address, [watched.address], 0)
    assert waits(log)[0] == (7, own.device("gate_closed"), 0, 1, 0xFFFFFFFF)
    log.write_text("")
    native._hip_waits_for_test(str(library), 7, own.address, [], 0)
    assert waits(log) == [(7, own.device("gate_closed"), 0, 1, 0xFFFFFFFF)]


def test_a_read_only_watched_block_falls_back_to_the_own_word_counted(native, fake_hip) -> None:
    library, log = fake_hip
    own, watched = Block(), Block(read_only=True)
    pages, fallbacks = native._hip_waits_for_test(
        str(library), 9, own.address, [watched.address], 3
    )
    assert fallbacks == 1 and pages == 2  # asked once each: a refusal is remembered
    # the GPU cannot read the watched task: the barrier holds until the gate opens fully
    assert waits(log) == [(9, own.device("gate_closed"), 0, 1, 0xFFFFFFFF)]
    log.write_text("")
    _, fallbacks = native._hip_waits_for_test(str(library), 9, own.address, [watched.address], 3)
    assert fallbacks == 1  # a fresh gate state in the test hook: counted again, never silent


def test_a_runtime_that_waits_only_on_signal_memory_is_reported(
    native, fake_hip, monkeypatch
) -> None:
    library, _ = fake_hip
    monkeypatch.setenv("FAKE_HIP_SIGNAL_ONLY", "1")
    own = Block()
    with pytest.raises(RuntimeError, match="hipMallocSignalMemory"):
        native._hip_waits_for_test(str(library), 7, own.address, [], 0)


@pytest.mark.parametrize(
    ("support", "expected"),
    [("1", (True, "")), ("0", (False, "is 0")), ("unknown", (False, "cannot say"))],
)
def test_support_is_asked_through_the_device_attribute(
    native, fake_hip, monkeypatch, support, expected
) -> None:
    library, _ = fake_hip
    monkeypatch.setenv("FAKE_HIP_WAIT_VALUE", support)
    ok, why = native._hip_support_for_test(str(library))
    assert ok is expected[0] and expected[1] in why


def test_a_library_without_the_functions_is_refused(native) -> None:
    with pytest.raises(RuntimeError, match="does not offer the HIP functions"):
        native._hip_waits_for_test("libm.so.6", 1, Block().address, [], 0)


# --- the declarations in hip_api.h against HIP's headers ------------------------------------------

ABI_CHECK = r"""
#include <hip/hip_runtime_api.h>
#include <type_traits>
#include "hip_api.h"

template <class T> struct Abi { using type = T; };
template <> struct Abi<hipStream_t> { using type = void*; };
template <> struct Abi<hipError_t> { using type = int; };
template <> struct Abi<hipDeviceAttribute_t> { using type = int; };
template <class F> struct AbiFn;
template <class R, class... A> struct AbiFn<R (*)(A...)> {
  using type = typename Abi<R>::type (*)(typename Abi<A>::type...);
};
#define SAME(decl, ours) \
  static_assert(std::is_same<AbiFn<decltype(&decl)>::type, ours>::value, #decl " differs")

SAME(hipStreamWaitValue32, gpreempt_hip::WaitValue32);
SAME(hipHostRegister, gpreempt_hip::HostRegister);
SAME(hipHostGetDevicePointer, gpreempt_hip::HostGetDevicePointer);
SAME(hipGetDevice, gpreempt_hip::GetDevice);
SAME(hipDeviceGetAttribute, gpreempt_hip::DeviceGetAttribute);
static_assert(hipDeviceAttributeCanUseStreamWaitValue == gpreempt_hip::kAttrCanUseStreamWaitValue,
              "hipDeviceAttributeCanUseStreamWaitValue");
static_assert(hipErrorInvalidValue == gpreempt_hip::kErrorInvalidValue, "hipErrorInvalidValue");
static_assert(sizeof(hipError_t) == sizeof(gpreempt_hip::Result), "hipError_t size");
static_assert(std::is_pointer<hipStream_t>::value, "hipStream_t is a handle");
static_assert(hipSuccess == 0, "hipSuccess");
static_assert(hipStreamWaitValueEq == gpreempt_hip::kWaitEq, "hipStreamWaitValueEq");
static_assert(hipHostRegisterPortable == gpreempt_hip::kRegisterPortable, "Portable");
static_assert(hipHostRegisterMapped == gpreempt_hip::kRegisterMapped, "Mapped");
static_assert(hipErrorHostMemoryAlreadyRegistered == gpreempt_hip::kAlreadyRegistered,
              "hipErrorHostMemoryAlreadyRegistered");
int main() { return 0; }
"""


def _hip_toolchain() -> str:
    compiler = shutil.which("c++") or shutil.which("g++")
    if not HIP_HEADER.exists() or compiler is None:
        pytest.skip(
            "HIP headers or a C++ compiler are absent: install them to run this check "
            "(Debian/Ubuntu: apt-get install -y hipcc libamdhip64-dev)"
        )
    return compiler


def test_hip_declarations_match_the_hip_headers(tmp_path) -> None:
    compiler = _hip_toolchain()
    source = tmp_path / "abi_check.cpp"
    source.write_text(ABI_CHECK)
    result = subprocess.run(
        [
            compiler,
            "-std=c++17",
            "-D__HIP_PLATFORM_AMD__",
            "-I",
            str(CSRC),
            "-I",
            str(HIP_INCLUDE),
            "-fsyntax-only",
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_hip_functions_are_exported_by_libamdhip64() -> None:
    _hip_toolchain()
    candidates = sorted(Path("/usr/lib").rglob("libamdhip64.so*")) + sorted(
        Path("/opt/rocm/lib").glob("libamdhip64.so*")
    )
    if not candidates or shutil.which("nm") is None:
        pytest.skip("libamdhip64.so or nm is absent (apt-get install -y libamdhip64-dev binutils)")
    exported = subprocess.run(
        ["nm", "-D", "--defined-only", str(candidates[0])], capture_output=True, text=True
    ).stdout.split()
    exported = {symbol.split("@")[0] for symbol in exported}  # versioned: name@@hip_4.2
    names = re.findall(r'k\w+Name = "(\w+)"', (CSRC / "hip_api.h").read_text())
    assert len(names) == 5
    for name in names:
        assert name in exported, f"{name} is not exported by {candidates[0]}"
    assert "dlsym(lib, gpreempt_hip::k" in HIP_BARRIERS.read_text()


def test_gate_source_builds_as_hipified_cpp(tmp_path) -> None:
    """The extension source has no CUDA-only include, so a ROCm build (plain C++ against
    PyTorch's headers, ``with_cuda=False``) needs neither CUDA nor HIP headers."""
    for path in (*SOURCES, *HEADERS):
        includes = re.findall(r"#include [<\"]([^>\"]+)[>\"]", path.read_text())
        assert not [i for i in includes if i.startswith(("cuda", "hip/", "c10/cuda", "ATen/cuda"))]
    assert '#include "hip_api.h"' in HIP_BARRIERS.read_text()
