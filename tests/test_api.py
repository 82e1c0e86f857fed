"""The public API: the names `gpreempt` exports are pinned, so a change to them is deliberate.

As trio's `_tests/test_exports.py` does: adding or removing a public name must change this
list in the same commit (and the README's Python API paragraph with it).
"""

from __future__ import annotations

import subprocess
import sys

import gpreempt

PUBLIC_API = {
    # request the GPU and yield it
    "request",
    "should_yield",
    "yield_point",
    # act on tasks through the daemon
    "attach",
    "suspend",
    "resume",
    "evict",
    "restore",
    "status",
    # in-process scheduling between threads
    "GPUScheduler",
    # priorities
    "parse_priority",
    # errors
    "GpreemptError",
    "DaemonUnavailable",
    "MechanismUnavailable",
    "NoSuchTask",
    "PermissionDenied",
    "PriorityError",
    "UsageError",
    "__version__",
}


def test_all_is_the_pinned_public_api() -> None:
    assert len(gpreempt.__all__) == len(set(gpreempt.__all__)), "a name is listed twice"
    assert set(gpreempt.__all__) == PUBLIC_API


def test_every_exported_name_exists() -> None:
    missing = [name for name in gpreempt.__all__ if not hasattr(gpreempt, name)]
    assert missing == []


def test_star_import_gives_exactly_the_public_api() -> None:
    namespace: dict[str, object] = {}
    exec("from gpreempt import *", namespace)
    namespace.pop("__builtins__")
    assert set(namespace) == PUBLIC_API


def test_errors_share_one_base_class() -> None:
    for name in PUBLIC_API:
        obj = getattr(gpreempt, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, gpreempt.GpreemptError), name


def test_importing_gpreempt_loads_neither_torch_nor_nvml() -> None:
    """`import gpreempt` must work, and stay cheap, on a machine without the GPU extras."""
    code = "import sys, gpreempt; print(sorted(m for m in ('torch', 'pynvml') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_the_bench_harness_imports_neither_torch_nor_matplotlib() -> None:
    """The bench's own process must hold no CUDA context: torch loads only in its children."""
    code = (
        "import sys, gpreempt.cli.bench, gpreempt.bench.runner, gpreempt.bench.workloads;"
        "assert 'torch' not in sys.modules and 'matplotlib' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
