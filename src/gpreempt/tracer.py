"""``gpreempt run --mechanism kfd``: the launcher traces its command, invisibly.

The KFD debugger interface answers only to the target's ptrace parent, and the kernel means
the very *thread* that attached. So one dedicated thread seizes the command with
``PTRACE_SEIZE``, performs every ptrace and KFD call, and stays alive as long as the command
does; a second thread waits for the command's state changes and hands them to it.

The one option is ``PTRACE_O_TRACEEXEC``: a KFD debug session belongs to the process's memory
map, and the kernel ends it when the process execs (kfd_process.c,
kfd_process_notifier_release_internal). ``gpreempt run`` traces its wrapper before it execs the
command, so the session is opened only after that exec, and forgotten at any later one
(:meth:`KfdSession.on_exec`); the exec stop is continued at once.

The command must not notice: every signal it receives is delivered as sent (a stop of the
tracee is restarted at once with the same signal), a stop signal stops it as it would stop an
untraced process (``PTRACE_LISTEN``: it stays stopped until SIGCONT), and its exit code or
killing signal is returned as :class:`subprocess.Popen` would. Since the tracer thread reaps
the command, the launcher uses :class:`TracedProcess` in place of its ``Popen``.

The daemon reaches the tracer through an abstract Unix socket named after the command's pid;
it checks with ``SO_PEERCRED`` that the socket's owner really traces the command, and the
tracer takes requests from its own user and root only.

When the command exits, or the launcher ends in any way, its queues are resumed: by
:meth:`KfdSession.close` here, and by the kernel itself for a launcher that is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import select
import signal
import socket
import struct
import subprocess
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import GpreemptError, MechanismFailed, MechanismUnavailable
from .mechanisms.kfd import control_address
from .mechanisms.kfd_session import KfdSession, SuspendOutcome

T = TypeVar("T")

PTRACE_CONT = 7
PTRACE_SEIZE = 0x4206
PTRACE_LISTEN = 0x4208
PTRACE_EVENT_STOP = 128
PTRACE_EVENT_EXEC = 4
PTRACE_O_TRACEEXEC = 0x10
WALL = 0x40000000  # __WALL: wait for the traced thread whatever its kind
STOP_SIGNALS = frozenset({signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU})
#: How long a request to the tracer thread may take before its caller gives up.
CALL_TIMEOUT_S = 30.0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


def ptrace(request: int, pid: int, data: int = 0) -> None:
    if _libc.ptrace(request, pid, None, ctypes.c_void_p(data)) == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class _Call:
    """A function to run on the tracer thread, and where its outcome goes."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class TracedProcess:
    """A child of this process, traced for the KFD interface; stands in for its ``Popen``.

    ``session_factory`` makes the KFD session (tests give it a fake KFD); ``serve`` opens the
    socket the daemon talks to; ``awaiting_exec``: the process is a wrapper that has yet to
    exec the command (``gpreempt run``'s), and no session opens before that exec.
    """

    def __init__(
        self,
        process: subprocess.Popen[Any],
        session_factory: Callable[[int], KfdSession] = KfdSession,
        serve: bool = True,
        awaiting_exec: bool = False,
    ) -> None:
        self.pid = process.pid
        self._awaiting_exec = awaiting_exec
        self.returncode: int | None = None
        self._popen = process
        self._factory = session_factory
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._exited = threading.Event()
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._listener: socket.socket | None = None
        self.session: KfdSession | None = None
        self._thread = threading.Thread(target=self._trace, name="gpreempt-tracer", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            raise self._start_error
        if serve:
            try:
                self._listen()
            except BaseException:
                self.kill()
                self.wait()
                raise

    # --- what the launcher uses (the Popen subset) ------------------------------------------
    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    # --- KFD, on the tracer thread ------------------------------------------------------------
    def call(self, fn: Callable[[], T], timeout: float = CALL_TIMEOUT_S) -> T:
        """Run ``fn`` on the tracer thread (the only one the kernel accepts) and return its
        result."""
        if self._exited.is_set():
            raise MechanismFailed(f"process {self.pid} has exited")
        job = _Call(fn)
        self._inbox.put(("call", job))
        if not job.done.wait(timeout):
            raise MechanismFailed(f"the tracer of process {self.pid} did not answer in time")
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[no-any-return]

    def suspend_queues(self) -> SuspendOutcome:
        return self.call(lambda: self._session().suspend())

    def resume_queues(self) -> int:
        """Resume what is suspended; never raises for a command that has exited."""
        if self._exited.is_set():
            return 0
        return self.call(lambda: self._session().resume())

    def held_queues(self) -> int:
        """How many of the command's queues are suspended now."""
        if self._exited.is_set():
            return 0
        return self.call(lambda: len(self._session().suspended))

    def _session(self) -> KfdSession:
        assert self.session is not None
        return self.session

    # --- the tracer thread -----------------------------------------------------------------------
    def _trace(self) -> None:
        try:
            ptrace(PTRACE_SEIZE, self.pid, PTRACE_O_TRACEEXEC)
        except OSError as exc:
            self._start_error = MechanismUnavailable(
                f"cannot trace process {self.pid} for mechanism 'kfd' ({exc.strerror}): "
                "allow a parent to trace its child (kernel.yama.ptrace_scope 0 or 1; in a "
                "container, a seccomp profile that permits ptrace)"
            )
            self._ready.set()
            return
        self.session = self._factory(self.pid)
        self.session.awaiting_exec = self._awaiting_exec
        threading.Thread(target=self._wait_loop, name="gpreempt-tracee-wait", daemon=True).start()
        self._ready.set()
        try:
            while not self._exited.is_set():
                try:
                    kind, item = self._inbox.get(timeout=0.1)
                except queue.Empty:
                    kind, item = "idle", None
                if kind == "status":
                    self._on_status(item)
                elif kind == "call":
                    self._run_call(item)
                self._answer_kfd_events()
        finally:
            with contextlib.suppress(GpreemptError, OSError):
                self.session.close()  # resumes whatever is still suspended
            self._drain_calls()

    def _run_call(self, job: _Call) -> None:
        try:
            job.result = job.fn()
        except BaseException as exc:  # handed to the caller's thread
            job.error = exc
        job.done.set()

    def _drain_calls(self) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "call":
                item.error = MechanismFailed(f"process {self.pid} has exited")
                item.done.set()

    def _answer_kfd_events(self) -> None:
        fd = self.session.events_fd if self.session is not None else -1
        if fd >= 0 and select.select([fd], [], [], 0)[0]:
            with contextlib.suppress(GpreemptError):
                self.session.answer_events()  # type: ignore[union-attr]

    def _on_status(self, status: int) -> None:
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            self.returncode = os.waitstatus_to_exitcode(status)
            self._popen.returncode = self.returncode  # so Popen never waits for it itself
            if self._listener is not None:
                with contextlib.suppress(OSError):
                    self._listener.shutdown(socket.SHUT_RDWR)
            self._exited.set()
            return
        if not os.WIFSTOPPED(status):
            return
        signum = os.WSTOPSIG(status)
        event = status >> 16
        try:
            if event == PTRACE_EVENT_EXEC and self.session is not None:
                self.session.on_exec()  # the kernel ended the session with the old program
                ptrace(PTRACE_CONT, self.pid)
            elif event == PTRACE_EVENT_STOP and signum in STOP_SIGNALS:
                ptrace(PTRACE_LISTEN, self.pid)  # a group stop: stay stopped until SIGCONT
            elif event:
                ptrace(PTRACE_CONT, self.pid)  # the end of a listen, or another trap: go on
            else:
                ptrace(PTRACE_CONT, self.pid, signum)  # a signal on its way: deliver it as sent
        except ProcessLookupError:
            pass  # killed meanwhile: its exit status follows

    def _wait_loop(self) -> None:
        while True:
            try:
                _, status = os.waitpid(self.pid, WALL)
            except ChildProcessError:
                self._inbox.put(("status", 0))
                return
            except InterruptedError:
                continue
            self._inbox.put(("status", status))
            if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                return

    # --- the daemon's socket ---------------------------------------------------------------------
    def _listen(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            listener.bind(control_address(self.pid))
        except OSError as exc:
            listener.close()
            raise MechanismUnavailable(
                f"cannot open the KFD control socket of process {self.pid}: {exc}"
            ) from None
        listener.listen(8)
        self._listener = listener
        threading.Thread(target=self._serve, name="gpreempt-kfd-control", daemon=True).start()

    def _serve(self) -> None:
        assert self._listener is not None
        while not self._exited.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                break
            with conn:
                conn.settimeout(CALL_TIMEOUT_S)
                with contextlib.suppress(OSError, ValueError):
                    self._answer(conn)
        with contextlib.suppress(OSError):
            self._listener.close()

    def _answer(self, conn: socket.socket) -> None:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", creds)
        if uid not in (os.getuid(), 0):
            conn.sendall(b'{"ok": false, "error": "not your task"}\n')
            return
        line = b""
        while not line.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                return
            line += chunk
        op = json.loads(line).get("op")
        try:
            if op == "ping":
                reply: dict[str, Any] = {"ok": True}
            elif op == "suspend":
                outcome = self.suspend_queues()
                reply = {
                    "ok": True,
                    "suspended": outcome.suspended,
                    "queues": outcome.queues,
                    "refused": outcome.refused,
                }
            elif op == "resume":
                reply = {"ok": True, "queues": self.resume_queues()}
            elif op == "held":  # how many queues are suspended now (gpreempt selftest)
                reply = {"ok": True, "suspended": self.held_queues()}
            else:
                reply = {"ok": False, "error": f"unknown request {op!r}"}
        except GpreemptError as exc:
            reply = {"ok": False, "error": str(exc)}
        conn.sendall(json.dumps(reply).encode() + b"\n")


def traced(process: subprocess.Popen[Any]) -> TracedProcess:
    """Trace ``process`` (a child of this process that has not exec'd its command yet) for
    mechanism kfd. If it cannot be traced, the child is killed and reaped, and the reason
    raised: it must never run unseen."""
    try:
        return TracedProcess(process, awaiting_exec=True)  # the wrapper execs the command
    except BaseException:
        if process.poll() is None:
            process.kill()
            process.wait()
        raise
