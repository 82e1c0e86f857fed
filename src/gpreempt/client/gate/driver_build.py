"""Building the driver-level gate (``csrc/driver_*.cpp``) for ``CUDA_INJECTION64_PATH``.

The library is plain C++ against the CUDA driver and CUPTI headers (``cuda.h``, ``cupti.h``,
``generated_cuda_meta.h``), linked to ``libcupti``; the driver's own functions are looked up in
the ``libcuda`` that loads it. No PyTorch, no nvcc. It is compiled once per user and source
(about 2 s with g++) into the same cache as the operator gate
(:func:`gpreempt.client.gate.build.cache_root`), under the same kind of build lock
(:func:`gpreempt.client.gate.build.build_lock`): a stopped builder is not waited for forever.
The headers and libraries are found in ``$CUDA_HOME`` (or ``$CUDA_PATH``), the usual toolkit
places, and the ``nvidia`` wheels PyTorch installs (``nvidia/cu13``, ``nvidia/cuda_cupti``,
``nvidia/cuda_runtime``). Build it ahead of time (a container image) with
``python -m gpreempt.client.gate.driver_build``.
"""

from __future__ import annotations

import glob
import os
import sysconfig
from pathlib import Path

from .build import CSRC, build_plain_library, report_build

SOURCES = tuple(sorted(CSRC.glob("driver_*.cpp")))
HEADERS = (
    CSRC / "driver_gate.h",
    CSRC / "driver_callbacks.h",
    CSRC / "driver_cupti.h",
    CSRC / "asleep_drain.h",
    CSRC / "barrier_check.h",
    CSRC / "callback_mode.h",
    CSRC / "control_layout.h",
    CSRC / "gate_words.h",
    CSRC / "launch_hold.h",
    CSRC / "visible_devices.h",
)
LIBRARY_PREFIX = "libgpreempt_driver_"
#: Headers the library needs, all in one include directory or split over a few.
NEEDED_HEADERS = ("cuda.h", "cupti.h", "generated_cuda_meta.h")


class DriverGateUnavailable(RuntimeError):
    """The driver-level gate cannot be built here; the message says why, in one line."""


def _toolkit_roots() -> list[Path]:
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    found = [Path(r) for r in roots if r]
    found += [Path(p) for p in sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
    purelib = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    for sub in ("cu13", "cu12", "cuda_cupti", "cuda_runtime", "cuda_nvcc"):
        found.append(purelib / sub)
    for extra in list(found):
        found.append(extra / "extras" / "CUPTI")
    return [r for r in found if r.is_dir()]


def find_include_dirs(roots: list[Path] | None = None) -> list[Path]:
    """Include directories that hold every header of :data:`NEEDED_HEADERS` between them."""
    dirs: list[Path] = []
    missing = set(NEEDED_HEADERS)
    for root in _toolkit_roots() if roots is None else roots:
        for include in (root / "include", root / "targets" / "x86_64-linux" / "include"):
            have = {h for h in missing if (include / h).is_file()}
            if have:
                dirs.append(include)
                missing -= have
    if missing:
        raise DriverGateUnavailable(
            f"no CUDA toolkit headers ({', '.join(sorted(missing))}) in $CUDA_HOME, "
            "/usr/local/cuda or the nvidia wheels"
        )
    return dirs


def find_library_dir(name: str, roots: list[Path] | None = None) -> Path:
    """The directory of ``lib<name>.so*`` in the toolkit or the system."""
    places: list[Path] = []
    for root in _toolkit_roots() if roots is None else roots:
        places += [root / "lib64", root / "lib", root / "lib64" / "stubs", root / "lib" / "stubs"]
    places += [Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64"), Path("/usr/lib")]
    for place in places:
        if any(place.glob(f"lib{name}.so*")):
            return place
    raise DriverGateUnavailable(f"no lib{name}.so in the CUDA toolkit or the system")


def _link_flag(directory: Path, name: str) -> str:
    """``-l`` for the library: the plain name where a ``.so`` link exists, else its file."""
    if (directory / f"lib{name}.so").exists():
        return f"-l{name}"
    versions = sorted(directory.glob(f"lib{name}.so.*"))
    return f"-l:{versions[0].name}"


def build(*, quiet: bool = True) -> Path:
    """The built library (compiled now if not cached); raises DriverGateUnavailable."""
    includes = find_include_dirs()
    cupti = find_library_dir("cupti")
    link = (f"-L{cupti}", _link_flag(cupti, "cupti"), f"-Wl,-rpath,{cupti}")
    return build_plain_library(  # the library runs in every process of the user's commands
        "the driver-level gate", "driver_gate", LIBRARY_PREFIX, SOURCES, HEADERS,
        DriverGateUnavailable, includes=includes, link=(*link, "-ldl", "-lpthread", "-Wl,-z,defs"),
        announce=not quiet,
    )  # fmt: skip


def main() -> int:
    """Build the library now (``python -m gpreempt.client.gate.driver_build``)."""
    return report_build(lambda: build(quiet=False), "driver-level gate", DriverGateUnavailable)


if __name__ == "__main__":
    raise SystemExit(main())
