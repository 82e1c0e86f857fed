"""Loading the native gate survives a loader that was killed while it held torch's build lock."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")

from gpreempt.client.gate.build import (  # noqa: E402
    NativeGateUnavailable,
    cache_root,
    extension_name,
    load_native,
)


def test_a_lock_file_left_by_a_killed_loader_does_not_hang_the_next_one() -> None:
    try:
        load_native()  # built (or loaded) once, as every gated process does
    except NativeGateUnavailable as exc:
        pytest.skip(f"native gate unavailable: {exc}")
    build_dir = cache_root() / extension_name()
    # what a process killed inside cpp_extension.load leaves: torch's lock file, which makes
    # every later load wait for it forever
    (build_dir / "lock").touch()

    done = subprocess.run(
        [sys.executable, "-c", "from gpreempt.client.gate.build import load_native as l; l()"],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    assert not (build_dir / "lock").exists()
