"""What GPU this run is on, found without importing torch or NVML into the harness itself; and
the checks the GPU scripts under ``benchmarks/`` make before they start."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: What a bench's results.json says of the GPU it ran on (of :func:`describe`'s fields).
DEVICE_FIELDS = ("name", "driver", "cuda", "torch")

_PROBE = r"""
import json
info = {"name": None, "driver": None, "cuda": None, "torch": None, "count": 0}
try:
    import torch
    info["torch"] = torch.__version__
    info["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        info["count"] = torch.cuda.device_count()
        info["name"] = torch.cuda.get_device_name(0)
except Exception as exc:
    info["torch_error"] = str(exc)
try:
    from gpreempt.nvml import NA, open_nvml
    nv = open_nvml()
    if not isinstance(nv, NA):
        with nv:
            driver = nv.driver_version()
            info["driver"] = None if isinstance(driver, NA) else driver
            if info["name"] is None and not isinstance(nv.device_count(), NA):
                name = nv.gpu(0, with_processes=False).name
                info["name"] = None if isinstance(name, NA) else name
except Exception:
    pass
print(json.dumps(info))
"""


def gpu_present() -> bool:
    """True when ``nvidia-smi -L`` lists at least one GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        result = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and "GPU" in result.stdout


def describe(python: str = sys.executable) -> dict[str, Any]:
    """{name, driver, cuda, torch, count} of GPU 0, probed in a child process (so this process
    never holds a CUDA context that would share the GPU with the benchmark)."""
    try:
        result = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120)
        info = json.loads(result.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError, IndexError):
        info = {"name": None, "driver": None, "cuda": None, "torch": None, "count": 0}
    if info.get("driver") is None and shutil.which("nvidia-smi"):
        try:
            query = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            name, _, driver = query.stdout.splitlines()[0].partition(",")
            info["driver"] = driver.strip() or None
            info["name"] = info.get("name") or name.strip() or None
        except (OSError, subprocess.TimeoutExpired, IndexError):
            pass
    return info


def rounds_parser(description: str, modes: Sequence[str], rounds: int) -> argparse.ArgumentParser:
    """The options of a GPU script that starts a server process per mode and round:
    ``--rounds``, ``--requests``, ``--modes`` (comma-separated, of ``modes``), ``--out``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument(
        "--modes", default=",".join(modes), help="comma-separated, of " + ", ".join(modes)
    )
    parser.add_argument("--out", type=Path)
    return parser


def usable_modes(script: str, given: str, known: Sequence[str]) -> list[str] | None:
    """The modes ``given`` names, or None after one line on stderr (``script: why``) where they
    are wrong or this machine cannot run them (:func:`chosen_modes`, :func:`missing_cuda`)."""
    modes, wrong = chosen_modes(given, known)
    problem = wrong or missing_cuda()
    if problem:
        print(f"{script}: {problem}", file=sys.stderr)
        return None
    return modes


def chosen_modes(given: str, known: Sequence[str]) -> tuple[list[str], str | None]:
    """The modes a GPU script's comma-separated ``--modes`` names, and what is wrong with them
    (None where nothing is): a line that lists the known ones."""
    modes = [m for m in given.split(",") if m]
    unknown = sorted(set(modes) - set(known))
    if unknown or not modes:
        return modes, f"--modes takes {', '.join(known)}; not {unknown}"
    return modes, None


def missing_cuda() -> str | None:
    """Why a GPU script cannot run here (no PyTorch, or no CUDA GPU), or None. It imports torch:
    for the scripts under ``benchmarks/``, never the bench's harness."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed here"
    return None if torch.cuda.is_available() else "no CUDA GPU here"
