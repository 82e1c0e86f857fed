"""``gpreempt run``: start a command as a task, supervise it, and never leave it suspended.

The launcher starts the daemon if none answers, starts the command in its own session and
process group (so the daemon can stop the command's helpers with it), registers it before it
runs its first instruction, forwards SIGINT/SIGTERM/SIGHUP, and returns its exit code. If the
daemon goes away, the launcher resumes the command itself at once and registers it again
with whichever daemon comes back.

The command's own session keeps it alive if the launcher is killed while the command is
stopped: a stopped process group that becomes orphaned within its session gets SIGHUP from
the kernel, and that would kill most commands; a group in a session of its own is never
orphaned by the launcher's death. A daemon that stops answering never leaves the command
stopped or unmanaged by surprise: the launcher resumes it, says so, and runs it on.
"""

from __future__ import annotations

import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..config import (
    DAEMON_LOG_NAME,
    ENV_RUNTIME_DIR,
    ENV_TASK_ID,
    ensure_private_dir,
    env_number,
    resolve_runtime_dir,
)
from ..errors import DaemonNotStartable, DaemonUnavailable, GpreemptError, UsageError
from ..mechanisms import kind
from ..mechanisms.cuda_driver import release_process
from ..messages import RegisterRequest, TaskFields
from ..runtime_dir import read_only
from .connection import DaemonClient
from .framework_settings import framework_settings

#: How long to wait for a daemon we started to answer.
DAEMON_START_TIMEOUT_S = 10.0
#: How long a request may wait for the daemon's answer ($GPREEMPT_DAEMON_TIMEOUT_S).
ENV_DAEMON_TIMEOUT = "GPREEMPT_DAEMON_TIMEOUT_S"
DEFAULT_DAEMON_TIMEOUT_S = 10.0
#: How long the launcher waits for the daemon to note how its command ended.
EXIT_REPORT_TIMEOUT_S = 2.0
#: How often a launcher whose daemon vanished looks for a new one.
RECONNECT_PERIOD_S = 1.0

#: Run by the child before the command: take the command's name (what the daemon reads from
#: /proc when the task registers, so that `status` shows `sleep`, not `python3`), say so,
#: wait for the launcher's go, then become the command.
_WAIT_THEN_EXEC = (
    "import os, sys\n"
    "go, ready = int(sys.argv[1]), int(sys.argv[2])\n"
    "try:\n"
    "    with open('/proc/self/comm', 'w') as f:\n"
    "        f.write(os.path.basename(sys.argv[3])[:15] or sys.argv[3][:15])\n"
    "except (OSError, ValueError):\n"
    "    pass\n"
    "os.close(ready)\n"
    "os.read(go, 1)\n"
    "os.close(go)\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n"
)
#: How long the launcher waits for the child to take its command's name before registering.
NAMED_TIMEOUT_S = 10.0

AGENT_SITE = Path(__file__).resolve().parent / "_agent_site"
#: The directory that holds the ``gpreempt`` package (``src/`` of a checkout).
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def say(message: str) -> None:
    print(f"gpreempt: {message}", file=sys.stderr, flush=True)


def daemon_timeout() -> float:
    """Seconds a request waits for the daemon's answer."""
    value = env_number(ENV_DAEMON_TIMEOUT, float, 0.1, "seconds")
    return DEFAULT_DAEMON_TIMEOUT_S if value is None else value


def connect_or_start_daemon(runtime_dir: Path, policy: str | None = None) -> DaemonClient:
    """A connection to the runtime directory's daemon, starting one in the background if needed."""
    timeout = daemon_timeout()
    try:
        return check_policy(DaemonClient.connect(runtime_dir, timeout=timeout), policy)
    except DaemonUnavailable:
        pass
    if read_only(runtime_dir):
        raise DaemonNotStartable(
            f"no gpreempt daemon answers at {runtime_dir}, and none can start there: the "
            "directory is read-only (a node daemon's, mounted read-only)"
        )
    ensure_private_dir(runtime_dir)
    command = [sys.executable, "-m", "gpreempt", "serve", "--runtime-dir", str(runtime_dir)]
    if policy:
        command += ["--policy", policy]
    log_fd = os.open(
        runtime_dir / DAEMON_LOG_NAME,
        os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW,
        0o600,
    )
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
            env=_env_with_package(os.environ.copy()),
        )
    finally:
        os.close(log_fd)
    deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            try:  # another launcher may have won the race to start one
                return check_policy(DaemonClient.connect(runtime_dir, timeout=timeout), policy)
            except DaemonUnavailable:
                raise DaemonUnavailable(
                    f"the daemon could not start (exit code {process.returncode}); "
                    f"see {runtime_dir / DAEMON_LOG_NAME}"
                ) from None
        try:
            client = DaemonClient.connect(runtime_dir, timeout=timeout)
        except DaemonUnavailable:
            time.sleep(0.05)
            continue
        say(f"started a daemon (pid {process.pid}, {runtime_dir}); `gpreempt stop` stops it")
        return client
    raise DaemonUnavailable(
        f"the daemon started but did not answer within {DAEMON_START_TIMEOUT_S:.0f} s; "
        f"see {runtime_dir / DAEMON_LOG_NAME}"
    )


def check_policy(client: DaemonClient, policy: str | None) -> DaemonClient:
    """``client``, after one line on stderr if its daemon runs another policy than the one
    asked for: ``--policy`` applies only to a daemon that ``run`` starts."""
    running = client.ping().get("policy") if policy else None
    if running and running != policy:
        say(
            f"the daemon already running uses policy {running}, not {policy}: "
            f"to change it, stop it (`gpreempt stop`) and run again"
        )
    return client


def _env_with_package(env: dict[str, str]) -> dict[str, str]:
    """Make this gpreempt importable in a child, whatever Python it runs."""
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(PACKAGE_ROOT) not in parts:
        parts.append(str(PACKAGE_ROOT))
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def child_environment(runtime_dir: Path, spec: TaskFields | None = None) -> dict[str, str]:
    """The command's environment: where the daemon is, the in-process client on PYTHONPATH;
    for ``spec``'s task, the driver-level gate and :mod:`.framework_settings`."""
    env = os.environ.copy()
    env[ENV_RUNTIME_DIR] = str(runtime_dir.resolve())
    env[ENV_TASK_ID] = "1"
    parts = [str(AGENT_SITE)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    # CUDA's checkpoint lock refuses a process that loaded a tools library
    # (CUDA_ERROR_NOT_SUPPORTED, even once the gate let go of CUPTI): a task held by the lock
    # runs without the driver-level gate
    if spec is not None and not kind(spec.mechanism).holds_driver_lock:
        from .gate.driver import command_environment

        extra, note = command_environment(env, spec.priority, kind(spec.mechanism).closes_gate)
        env.update(extra)
        if note:
            say(note)
    if spec is not None:
        env.update(framework_settings(env, spec.priority))
    return _env_with_package(env)


class Launcher:
    """Runs one command under the daemon, from start to exit code."""

    def __init__(
        self, command: list[str], spec: TaskFields, runtime_dir: str | None, policy: str | None
    ) -> None:
        """``spec``: what the command is registered with; ``policy``: the policy of a daemon
        this launcher starts (none: the daemon's default)."""
        if not command:
            raise UsageError("no command given: use `gpreempt run [OPTIONS] -- CMD ARGS...`")
        self.command = command
        self.spec = spec
        self.runtime_dir = resolve_runtime_dir(runtime_dir)
        self.policy = policy
        self.client: DaemonClient | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def run(self) -> int:
        executable = shutil.which(self.command[0])
        if executable is None:
            raise UsageError(f"command not found or not executable: {self.command[0]}")
        try:
            self.client = connect_or_start_daemon(self.runtime_dir, self.policy)
        except DaemonNotStartable as exc:  # the node's daemon is not up yet: wait for it
            say(f"{exc}: running the command without preemption until that daemon answers")
        go_r, go_w = os.pipe()
        ready_r, ready_w = os.pipe()
        try:
            # The command waits (in a minimal Python, before exec) until it is registered, so
            # that it never runs unseen by the daemon; the pid stays the same across exec.
            wrapper = [sys.executable, "-S", "-E", "-c", _WAIT_THEN_EXEC, str(go_r), str(ready_w)]
            self.process = subprocess.Popen(
                [*wrapper, *self.command],
                env=child_environment(self.runtime_dir, self.spec),
                start_new_session=True,  # never orphaned while stopped (module docstring)
                pass_fds=(go_r, ready_w),
            )
        except BaseException:
            os.close(ready_r)
            os.close(go_w)
            raise
        finally:
            os.close(go_r)
            os.close(ready_w)
        try:
            # registered under its command's name: wait until the child has taken it
            select.select([ready_r], [], [], NAMED_TIMEOUT_S)
        finally:
            os.close(ready_r)
        if kind(self.spec.mechanism).unmaps_queues:  # KFD answers the ptrace parent: trace it
            from ..tracer import traced

            try:
                self.process = traced(self.process)  # type: ignore[assignment]
            except BaseException:
                os.close(go_w)
                raise
        client = self.client  # None: no daemon yet, the command registers once one answers
        try:
            if client is not None:
                self._register(client)
        except DaemonUnavailable as exc:
            # It may have registered (and even stopped) the command before it stopped
            # answering: drop the connection (an owned task ends with it) and resume the
            # command ourselves before it runs unmanaged.
            assert client is not None
            client.close()
            self.client = None
            self._resume_child()
            say(
                f"{exc}: running the command without preemption; it registers with the "
                "daemon once one answers"
            )
        except GpreemptError:
            os.close(go_w)  # the child goes on without gpreempt only if we kill it: do so
            self.process.kill()
            self.process.wait()
            raise
        os.write(go_w, b"g")
        os.close(go_w)
        return self._supervise()

    def _register(self, client: DaemonClient) -> None:
        assert self.process is not None
        client.send(RegisterRequest(pid=self.process.pid, task=self.spec, owned=True))

    def _supervise(self) -> int:
        assert self.process is not None
        selector = selectors.DefaultSelector()
        pidfd = os.pidfd_open(self.process.pid)
        selector.register(pidfd, selectors.EVENT_READ, "child")
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        selector.register(wake_r, selectors.EVENT_READ, "signal")
        old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {s: signal.signal(s, self._forward) for s in handled}
        if self.client is not None:
            selector.register(self.client.connection.sock, selectors.EVENT_READ, "daemon")
        next_reconnect = 0.0
        try:
            while True:
                timeout = None if self.client is not None else RECONNECT_PERIOD_S
                events = selector.select(timeout)
                kinds = {key.data for key, _ in events}
                if "child" in kinds:
                    break
                if "signal" in kinds:
                    try:
                        while os.read(wake_r, 64):
                            pass
                    except BlockingIOError:
                        pass
                if "daemon" in kinds and self.client is not None and not self._daemon_alive():
                    selector.unregister(self.client.connection.sock)
                    self.client.close()
                    self.client = None
                    self._rescue()
                    next_reconnect = time.monotonic() + RECONNECT_PERIOD_S
                if self.client is None and time.monotonic() >= next_reconnect:
                    next_reconnect = time.monotonic() + RECONNECT_PERIOD_S
                    self._try_reconnect(selector)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            signal.set_wakeup_fd(old_wakeup)
            selector.close()
            os.close(pidfd)
            os.close(wake_r)
            os.close(wake_w)
        if self.client is not None:
            self._report_exit()
        code = self.process.wait()
        if self.client is not None:
            self.client.close()
        return 128 - code if code < 0 else code

    def _report_exit(self) -> None:
        """Tell the daemon how the command ended ("its command exited (code N)"), read before
        reaping it so that its pid still names it; a daemon that does not answer at once ends
        the task when the connection closes."""
        assert self.process is not None and self.client is not None
        try:
            info = os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:
            return
        status = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        try:
            self.client.connection.sock.settimeout(EXIT_REPORT_TIMEOUT_S)
            self.client.request("detach", target=str(self.process.pid), exit_status=status)
        except (GpreemptError, OSError):
            pass

    def _daemon_alive(self) -> bool:
        assert self.client is not None
        try:
            return bool(self.client.connection.sock.recv(4096, socket.MSG_DONTWAIT))
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False

    def _forward(self, signum: int, frame: object) -> None:
        """Pass a signal on to the command. A command the daemon suspended stays suspended:
        the signal waits until the daemon resumes it (resuming it here would let it run
        while the daemon says it is stopped). Without a daemon, nobody else would resume
        it, so it is resumed first."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            if self.client is None:
                os.killpg(self.process.pid, signal.SIGCONT)
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            pass

    def _rescue(self) -> None:
        """The daemon vanished: make sure our command runs, whatever held it."""
        if self._resume_child():
            say("the daemon went away; resumed the command and keep it running")

    def _resume_child(self) -> bool:
        """Unlock the command in the driver and SIGCONT its group; False if it is gone."""
        assert self.process is not None
        try:
            release_process(self.process.pid)
        except GpreemptError as exc:
            say(f"could not unlock {self.process.pid} in the driver: {exc}")
        if hasattr(self.process, "resume_queues"):  # mechanism kfd: its GPU queues
            try:
                self.process.resume_queues()
            except GpreemptError as exc:
                say(f"could not resume the GPU queues of {self.process.pid}: {exc}")
        try:
            os.killpg(self.process.pid, signal.SIGCONT)
        except ProcessLookupError:
            return False
        return True

    def _try_reconnect(self, selector: selectors.BaseSelector) -> None:
        try:
            client = DaemonClient.connect(self.runtime_dir, timeout=min(2.0, daemon_timeout()))
        except GpreemptError:
            return
        try:
            self._register(client)
        except (GpreemptError, OSError):
            client.close()
            return
        self.client = client
        selector.register(client.connection.sock, selectors.EVENT_READ, "daemon")
        say("registered again with a new daemon")
