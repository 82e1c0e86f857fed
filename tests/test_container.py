"""The container path for real: the daemon in one container (the host's PID namespace, as the
DaemonSet runs it), a high and a low task in two others with their own PID namespaces, all
sharing the runtime directory as pods share the node's hostPath.

Needs podman, runc and the test image (deploy/test-container.sh builds it: the base once per
machine, the image when the sources change); skipped with the reason where they are missing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import gpreempt, wait_for

# building the base image the first time takes minutes (deploy/test-container.sh)
pytestmark = [pytest.mark.container, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parent.parent
SKIP = 77

LOW = """
import time
i = 0
while True:
    i += 1
    if i % 20000 == 0:
        open("/run/gpreempt/progress.tmp", "w").write(str(i))
        __import__("os").replace("/run/gpreempt/progress.tmp", "/run/gpreempt/progress")
"""

HIGH = """
import time, gpreempt
time.sleep(1.0)
with gpreempt.request():
    open("/run/gpreempt/marker", "w").write("in")
    time.sleep(3.0)
open("/run/gpreempt/marker", "w").write("out")
time.sleep(1.0)
"""


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman runc debootstrap)")
    result = subprocess.run(
        [str(ROOT / "deploy" / "test-container.sh")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode == SKIP:
        pytest.skip(result.stderr.strip().splitlines()[-1])
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gpc-"))
    path.chmod(0o755)  # as the DaemonSet's hostPath: a --shared daemon never widens it itself
    yield path
    shutil.rmtree(path, ignore_errors=True)


def podman(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


def container(image: str, shared: Path, name: str, *args: str, user: str = "0:0") -> list[str]:
    """podman run options for a container that mounts ``shared`` as /run/gpreempt."""
    return [
        "run", "--runtime", "runc", "--name", name, "--network", "none", "--user", user,
        # podman's default limits are above what some hosts let a container set
        "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096",
        "-v", f"{shared}:/run/gpreempt", "-e", "GPREEMPT_RUNTIME_DIR=/run/gpreempt",
        *args, image,
    ]  # fmt: skip


def test_low_task_in_one_container_stops_for_a_high_task_in_another(
    image: str, shared_dir: Path
) -> None:
    tag = shared_dir.name
    names = [f"{tag}-daemon", f"{tag}-low", f"{tag}-high", f"{tag}-other"]
    try:
        daemon = podman(
            *container(
                image, shared_dir, names[0], "-d", "--pid", "host",
                "--cap-drop", "all", "--cap-add", "KILL,SYS_PTRACE",
            ),
            "serve", "--shared", "--runtime-dir", "/run/gpreempt",
        )  # fmt: skip
        assert daemon.returncode == 0, daemon.stderr
        assert wait_for(lambda: gpreempt(shared_dir, "status").returncode == 0, 30), podman(
            "logs", names[0]
        ).stdout
        low = podman(
            *container(image, shared_dir, names[1], "-d"),
            "run", "--priority", "low", "--name", "trainer", "--", "python3", "-c", LOW,
        )  # fmt: skip
        assert low.returncode == 0, low.stderr
        progress = shared_dir / "progress"

        def value() -> int:
            try:
                return int(progress.read_text() or 0)
            except (FileNotFoundError, ValueError):
                return 0

        def moved(seconds: float) -> int:
            before = value()
            time.sleep(seconds)
            return value() - before

        assert wait_for(lambda: value() > 0, 30), podman("logs", names[1]).stderr

        def trainer() -> dict:
            reply = json.loads(gpreempt(shared_dir, "status", "--json").stdout)
            return next(t for t in reply["tasks"] if t["name"] == "trainer")

        # the daemon acts on the host's pid of the task, not the one its container sees
        host_pid = trainer()["pid"]
        assert Path(f"/proc/{host_pid}/cmdline").read_bytes().startswith(b"python3")

        high = subprocess.Popen(
            ["podman", *container(image, shared_dir, names[2]),
             "run", "--priority", "high", "--name", "server", "--", "python3", "-c", HIGH],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        marker = shared_dir / "marker"
        assert wait_for(lambda: marker.exists() and marker.read_text() == "in", 60)
        time.sleep(0.3)
        assert trainer()["state"] == "suspended"
        assert moved(1.0) == 0, "the low task progressed during the high task's request()"

        # a task of another uid may not act on it
        other = podman(
            *container(image, shared_dir, names[3], user="1000:1000"), "resume", "trainer"
        )
        assert other.returncode == 1, (other.stdout, other.stderr)
        assert "belongs to uid 0" in other.stderr and "Traceback" not in other.stderr

        assert wait_for(lambda: marker.read_text() == "out", 30)
        assert wait_for(lambda: moved(0.3) > 0, 10), "the low task did not resume"
        assert trainer()["state"] == "running" and trainer()["preemptions"] >= 1
        assert high.wait(60) == 0, high.stderr.read()
    finally:
        podman("rm", "-f", "-t", "5", *names[1:])
        podman("stop", "-t", "10", names[0])  # SIGTERM: the daemon resumes what it holds
        podman("rm", "-f", names[0])
