"""A client whose daemon is gone lifts what that daemon wrote into its control block.

The daemon gives a task's gate an in-flight share while a more important task is registered
on its GPU (the gate stays tight, and its driver-level gate puts stream barriers), and lets it
sleep only while none was active for a while. Once the daemon is gone nothing can preempt the
process: left as they were, the share would keep the gate tight and putting barriers, and a
forbidden sleep would keep it awake, until a daemon adopts the block again. Read here from
outside, as the daemon would, through the block's descriptor in ``/proc``.
"""

from __future__ import annotations

import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path

from conftest import Daemon, spawn, stop_all, task_named, wait_for
from test_driver_gate import OWN_CHANNEL, _library

from gpreempt.config import SOCKET_NAME
from gpreempt.control import OFF_GATE_CLOSED, OFF_SLEEP_OK, OFF_WINDOW_SHARE_US

#: A process with the Python client that launches nothing: it registers and waits.
IDLE_CLIENT = "from gpreempt.client import session; import time; session.current(); time.sleep(60)"


def own_block(pid: int) -> dict[str, int] | None:
    """The words of process ``pid``'s own control block (the one memfd it holds writable: those
    it watches came read-only), or None while it has none."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            flags = Path(f"/proc/{pid}/fdinfo/{fd}").read_text().split("flags:")[1].split()[0]
        except (OSError, IndexError):
            continue
        if target.startswith("/memfd:gpreempt-control") and int(flags, 8) & 3 == os.O_RDWR:
            with open(f"/proc/{pid}/fd/{fd}", "rb") as f:
                words = f.read(64)
            return {
                name: struct.unpack_from("<I", words, offset)[0]
                for name, offset in (
                    ("gate", OFF_GATE_CLOSED),
                    ("share_us", OFF_WINDOW_SHARE_US),
                    ("sleep_ok", OFF_SLEEP_OK),
                )
            }
    return None


def _released_when_the_daemon_dies(runtime_dir: Path, low_command: list[str]) -> None:
    daemon = Daemon(runtime_dir)
    low = spawn(runtime_dir, "run", "--priority", "low", "--name", "trainer", "--", *low_command)
    high = spawn(runtime_dir, "run", "--priority", "high", "--", sys.executable, "-c", IDLE_CLIENT)
    try:
        assert wait_for(lambda: task_named(runtime_dir, "trainer") is not None, 20)
        pid = task_named(runtime_dir, "trainer")["pid"]
        # a more important task registered on its GPU: the daemon gives the trainer a share
        assert wait_for(lambda: (own_block(pid) or {}).get("share_us", 0) != 0, 20)
        daemon.stop(signal.SIGKILL)

        def released() -> bool:
            words = own_block(pid) or {}
            return words == {"gate": 0, "share_us": 0, "sleep_ok": 1}

        assert wait_for(released, 10), own_block(pid)
    finally:
        stop_all(low, high)
        daemon.stop()


def test_a_python_client_lifts_its_share_when_the_daemon_dies(runtime_dir) -> None:
    _released_when_the_daemon_dies(runtime_dir, [sys.executable, "-c", IDLE_CLIENT])


def test_a_program_on_its_own_channel_lifts_its_share_when_the_daemon_dies(
    runtime_dir, tmp_path
) -> None:
    _library()
    version = tmp_path / "version"
    _released_when_the_daemon_dies(
        runtime_dir, [sys.executable, "-S", "-c", OWN_CHANNEL, str(version)]
    )


def test_a_block_taken_by_a_daemon_that_never_answered_is_lifted_once_it_dies(tmp_path) -> None:
    """A daemon slow under load takes a program's block and writes its words, but its answer
    comes after the program gave up waiting (2 s); then it dies. The program, which holds no
    connection to it, must lift the words anyway: nothing else ever would."""
    path = str(_library())
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(runtime / SOCKET_NAME))
    listener.listen(4)
    env = {**os.environ, "CUDA_INJECTION64_PATH": path, "GPREEMPT_RUNTIME_DIR": str(runtime)}
    env.update(GPREEMPT_TASK_ID="1", GPREEMPT_DRIVER_BOUND="1")
    program = subprocess.Popen(
        [sys.executable, "-S", "-c", OWN_CHANNEL, str(tmp_path / "version")], env=env
    )
    try:
        listener.settimeout(30)
        conn, _ = listener.accept()
        _, fds, _, _ = socket.recv_fds(conn, 4096, 2)
        block = mmap.mmap(fds[0], os.fstat(fds[0]).st_size)
        struct.pack_into("<I", block, OFF_WINDOW_SHARE_US, 1000)  # as the daemon writes them
        struct.pack_into("<I", block, OFF_SLEEP_OK, 0)
        struct.pack_into("<I", block, OFF_GATE_CLOSED, 1)
        listener.close()  # it dies before answering: no retry finds a daemon
        conn.close()

        def words() -> tuple[int, int, int]:
            return tuple(
                struct.unpack_from("<I", block, off)[0]
                for off in (OFF_GATE_CLOSED, OFF_WINDOW_SHARE_US, OFF_SLEEP_OK)
            )

        assert wait_for(lambda: words() == (0, 0, 1), 15), words()
    finally:
        program.kill()
        program.wait()
