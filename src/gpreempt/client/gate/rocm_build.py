"""Building the HIP launch gate (``csrc/rocm/``), a rocprofiler-sdk tool library.

The library is plain C++ against the rocprofiler-sdk headers (``rocprofiler-sdk/*.h``, which
include HIP's and HSA's): no hipcc, no HIP library (the gate makes no HIP call). It is linked
to ``librocprofiler-sdk`` where one is given; where none is, its rocprofiler functions are
resolved from the one the runtime loaded. The headers are looked up in
``$GPREEMPT_ROCPROFILER_INCLUDE`` (one directory or several, separated by ``:``), then
``$ROCM_PATH/include`` and ``/opt/rocm/include``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .build import SHARED_LIBRARY_FLAGS, cxx_compiler

CSRC = Path(__file__).parent / "csrc" / "rocm"
SOURCES = tuple(sorted(CSRC.glob("*.cpp")))
ENV_INCLUDE = "GPREEMPT_ROCPROFILER_INCLUDE"
#: Headers the build needs, found in one include directory or over a few.
NEEDED_HEADERS = ("rocprofiler-sdk/registration.h", "hip/hip_runtime_api.h", "hsa/hsa.h")


class RocmGateUnavailable(RuntimeError):
    """The HIP launch gate cannot be built here; the message says why, in one line."""


def find_include_dirs(env: dict[str, str] | None = None) -> list[Path]:
    """Include directories that hold every header of :data:`NEEDED_HEADERS` between them."""
    env = dict(os.environ) if env is None else env
    candidates = [Path(p) for p in env.get(ENV_INCLUDE, "").split(os.pathsep) if p]
    if env.get("ROCM_PATH"):
        candidates.append(Path(env["ROCM_PATH"]) / "include")
    candidates.append(Path("/opt/rocm/include"))
    dirs: list[Path] = []
    missing = set(NEEDED_HEADERS)
    for include in candidates:
        have = {h for h in missing if (include / h).is_file()}
        if have:
            dirs.append(include)
            missing -= have
    if missing:
        raise RocmGateUnavailable(
            f"no rocprofiler-sdk/HIP headers ({', '.join(sorted(missing))}) in "
            f"${ENV_INCLUDE}, $ROCM_PATH/include or /opt/rocm/include"
        )
    return dirs


def build(
    target: Path, include_dirs: list[Path] | None = None, library_dir: Path | None = None
) -> Path:
    """Compile the library to ``target`` (linked to ``library_dir/librocprofiler-sdk.so``
    where given); raises RocmGateUnavailable with the compiler's first error."""
    compiler = cxx_compiler(RocmGateUnavailable)
    includes = find_include_dirs() if include_dirs is None else include_dirs
    command = [
        compiler, *SHARED_LIBRARY_FLAGS, "-D__HIP_PLATFORM_AMD__",
        *[f"-I{d}" for d in includes], *map(str, SOURCES), "-o", str(target), "-lpthread", "-ldl",
    ]  # fmt: skip
    if library_dir is not None:
        command += [f"-L{library_dir}", "-lrocprofiler-sdk", f"-Wl,-rpath,{library_dir}"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if "error" in line]
        raise RocmGateUnavailable(
            "compiling the HIP launch gate failed: " + (errors[0] if errors else result.stderr)
        )
    return target
