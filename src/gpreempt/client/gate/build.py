"""Building and loading the launch gate's C++ extension (``csrc/operator_gate*``).

The gate's per-operator hook must cost well under a microsecond, which only native code can do
(a Python hook per operator halves a training job's throughput). The extension is a few C++ files
(``csrc/operator_gate.h`` says which does what) compiled against the installed PyTorch on first
use with ``torch.utils.cpp_extension.load`` (about 20-60 s, once) and cached per user, keyed by
the sources, PyTorch and Python versions:

* ``$GPREEMPT_CACHE_DIR/torch_extensions/<name>`` if set, else
* ``$XDG_CACHE_HOME/gpreempt/torch_extensions/<name>`` (``~/.cache/gpreempt/...``).

Build it ahead of time (for example in a container image) with
``python -m gpreempt.client.gate.build``.

The same sources build against CUDA, ROCm and CPU-only builds of PyTorch: they are compiled as
plain C++ (``with_cuda=False``, so nothing is hipified and neither nvcc nor hipcc is needed),
reaches the device through c10's device-generic interface, and finds the driver functions of
its stream barriers at run time (libcuda, or libamdhip64 on ROCm; see ``csrc/hip_api.h``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

CSRC = Path(__file__).parent / "csrc"
#: The extension's sources (the driver-level gate's ``driver_*`` files beside them are not).
SOURCES = tuple(
    CSRC / f"operator_gate_{part}.cpp"
    for part in (
        "hook",
        "window",
        "events",
        "barriers_cuda",
        "barriers_hip",
        "threads",
        "install",
        "module",
    )
)
#: Headers the sources include: part of what a cached build was built from.
HEADERS = tuple(
    CSRC / name
    for name in (
        "operator_gate.h",
        "operator_gate_base.h",
        "asleep_drain.h",
        "control_layout.h",
        "gate_words.h",
        "hip_api.h",
    )
)
ENV_CACHE_DIR = "GPREEMPT_CACHE_DIR"

_loaded: ModuleType | None = None


class NativeGateUnavailable(RuntimeError):
    """The C++ gate cannot be built or loaded here; the message says why."""


def cache_root() -> Path:
    """The per-user directory that holds built extensions."""
    explicit = os.environ.get(ENV_CACHE_DIR)
    if explicit:
        return Path(explicit) / "torch_extensions"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "gpreempt" / "torch_extensions"


def extension_name() -> str:
    """A name unique to this source, PyTorch build and Python version."""
    import torch

    digest = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        digest.update(path.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(str(getattr(torch.version, "cuda", None)).encode())
    digest.update(str(getattr(torch.version, "hip", None)).encode())
    digest.update(sys.version.encode())
    return "gpreempt_gate_" + digest.hexdigest()[:16]


def cxx_compiler(error: type[Exception] = NativeGateUnavailable) -> str:
    """The C++ compiler every native part builds with (``$CXX``, else ``c++``); raises
    ``error``, in one line, where it is not on PATH."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise error(f"no C++ compiler ({compiler!r} is not on PATH); install g++ (or set CXX)")
    return compiler


def library_file_name(prefix: str, sources: Iterable[Path], *extra: str) -> str:
    """``prefix`` and a digest of the sources' names and contents (and of ``extra``): a plain
    C++ library's file name, new whenever what it is built from changes."""
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    for item in extra:
        digest.update(item.encode())
    return f"{prefix}{digest.hexdigest()[:16]}.so"


# How every native library of the gate is compiled (the plain ones and the HIP gate's).
SHARED_LIBRARY_FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden")


def build_plain_library(
    what: str,
    folder: str,
    prefix: str,
    sources: Sequence[Path],
    headers: Sequence[Path],
    error: type[Exception],
    *,
    includes: Sequence[Path],
    link: Sequence[str],
    announce: bool = False,
) -> Path:
    """A plain C++ library the client loads by path (the driver-level gate, the request
    counter), in ``folder`` of the cache, compiled now unless built from the same sources,
    headers and include directories before (:func:`compile_library`); raises ``error``, in
    one line."""
    compiler = cxx_compiler(error)
    name = library_file_name(prefix, (*sources, *headers), *map(str, includes))

    def command(output: Path) -> list[str]:
        return [
            compiler, *SHARED_LIBRARY_FLAGS, *[f"-I{d}" for d in includes], *map(str, sources),
            "-o", str(output), *link,
        ]  # fmt: skip

    try:
        return compile_library(cache_root().parent / folder, name, command, what, announce=announce)
    except NativeGateUnavailable as exc:
        raise error(str(exc)) from None


def _check_toolchain() -> None:
    from torch.utils import cpp_extension

    cxx_compiler()
    if not cpp_extension.is_ninja_available():
        raise NativeGateUnavailable("ninja is not installed; `pip install ninja`")


#: How long a loader waits for another one's build lock when it cannot tell that its holder
#: is building (a trainer stopped while building holds it): after that, a built extension is
#: imported without the lock, else the gate goes without it.
LOCK_WAIT_S = 10.0
#: How long it waits at most while the holder is alive and not stopped: a build takes 20-60 s,
#: longer on a busy machine; several processes started at once on a fresh machine all wait for
#: the first one's build, rather than going without the native gate for their whole life.
BUILD_WAIT_S = 300.0


def check_private(path: Path) -> None:
    """Refuse a cache directory another user could have planted: it must be a real
    directory of this user, not writable by group or others (its extension runs as us)."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise NativeGateUnavailable(
            f"{path} is not a private directory of yours (uid {info.st_uid}, mode "
            f"{stat.S_IMODE(info.st_mode):o}): its extension could be anyone's; set "
            f"{ENV_CACHE_DIR} to a directory only you can write"
        )


def compile_library(
    directory: Path,
    name: str,
    command: Callable[[Path], list[str]],
    what: str,
    *,
    announce: bool = False,
) -> Path:
    """``directory/name``, compiled now by running ``command(output)`` unless it is there: the
    plain C++ libraries the client loads by path (the driver-level gate, the request counter).
    The directory is made and must be private (its library runs in the user's processes); one
    process builds at a time (:func:`build_lock`), into a file of its own renamed when done; a
    failed compile leaves ``build.log``. ``what`` names it in messages; ``announce`` says on
    stderr that it builds. Raises NativeGateUnavailable, in one line."""
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        check_private(directory)
        check_private(directory.parent)
    except OSError as exc:
        raise NativeGateUnavailable(f"cannot create {directory}: {exc.strerror}") from None
    target = directory / name
    if target.exists():
        return target
    with build_lock(directory, what) as held:
        if target.exists():
            return target
        if not held:
            raise NativeGateUnavailable(f"another process holds the build lock of {directory}")
        if announce:
            print(f"gpreempt: building {what} in {directory}", file=sys.stderr)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        argv = command(partial)
        try:
            result = subprocess.run(argv, capture_output=True, text=True)
        except OSError as exc:  # a compiler on PATH that cannot run
            raise NativeGateUnavailable(f"cannot run {argv[0]} for {what}: {exc}") from None
        if result.returncode != 0:
            (directory / "build.log").write_text(" ".join(argv) + "\n" + result.stderr)
            raise NativeGateUnavailable(f"compiling {what} failed; see {directory / 'build.log'}")
        os.replace(partial, target)
        return target


def _import_built(name: str, built: Path) -> ModuleType:
    """Import an extension already built, without ``cpp_extension`` (and its lock file)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, built)
    if spec is None or spec.loader is None:
        raise NativeGateUnavailable(f"cannot import {built}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _running_holder(fd: int) -> int | None:
    """The pid the holder of the lock wrote into its file, if that process is alive and not
    stopped (its state in ``/proc``): then it is building. None else."""
    try:
        pid = int(os.pread(fd, 32, 0).split()[0])
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[:1]
    except (ValueError, IndexError, OSError):
        return None
    return pid if state and state[0] not in ("T", "t", "Z", "X") else None


@contextlib.contextmanager
def build_lock(directory: Path, what: str) -> Iterator[bool]:
    """Hold ``directory`` for one process at a time, with a lock the kernel drops when its
    holder dies; yields whether it got it. A loader waits as long as the holder runs (up to
    :data:`BUILD_WAIT_S`, saying once on stderr whom it waits for), and :data:`LOCK_WAIT_S`
    for a holder that is stopped or unknown; ``what`` names the build in that line."""
    fd = os.open(directory / "build.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        start = time.monotonic()
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                if waited >= LOCK_WAIT_S:
                    pid = _running_holder(fd)
                    if waited >= BUILD_WAIT_S or pid is None:
                        yield False  # stopped, gone or too long: the caller goes without
                        return
                    if not told:
                        print(
                            f"gpreempt: waiting for process {pid}, which builds {what}",
                            file=sys.stderr,
                            flush=True,
                        )
                        told = True
                time.sleep(0.02)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield True
    finally:
        os.close(fd)  # drops the lock


@contextlib.contextmanager
def _building(build_dir: Path) -> Iterator[bool]:
    """:func:`build_lock` on the extension's build directory.

    ``cpp_extension.load`` serialises its builds with a lock *file* (``lock``) that it creates
    on every load, built or not, and waits forever for while it exists: a process killed while
    holding it (a trainer stopped at start-up) would hang every later one at ``import torch``.
    Under this lock no other loader runs, so such a file is left over and goes.
    """
    with build_lock(build_dir, "the launch gate extension") as held:
        if held:
            with contextlib.suppress(FileNotFoundError):
                (build_dir / "lock").unlink()
        yield held


def load_native(*, verbose: bool = False) -> ModuleType:
    """Build (once per user and PyTorch version) and import the extension.

    Prints one line to stderr when it has to compile. Raises NativeGateUnavailable with the
    reason when it cannot.
    """
    global _loaded
    if _loaded is not None:
        return _loaded
    try:
        import torch  # noqa: F401
        from torch.utils import cpp_extension
    except ImportError as exc:
        raise NativeGateUnavailable(f"PyTorch is not importable: {exc}") from None
    name = extension_name()
    build_dir = cache_root() / name
    try:
        build_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        check_private(build_dir)
        check_private(build_dir.parent)
    except OSError as exc:
        raise NativeGateUnavailable(
            f"cannot create the build directory {build_dir}: {exc}"
        ) from None
    built = build_dir / f"{name}.so"
    if not built.exists():
        _check_toolchain()
    try:
        with _building(build_dir) as held:
            if not held:
                if not built.exists():
                    raise NativeGateUnavailable(
                        f"another process holds the build lock of {build_dir}"
                    )
                module = _import_built(name, built)
                _loaded = module
                return module
            if not built.exists():  # said by the one process that builds, not by its waiters
                print(
                    f"gpreempt: building the launch gate extension in {build_dir} (once, 20-60 s)",
                    file=sys.stderr,
                    flush=True,
                )
            module = cpp_extension.load(
                name=name,
                sources=[str(source) for source in SOURCES],
                extra_cflags=["-O2"],
                extra_include_paths=[str(CSRC)],
                build_directory=str(build_dir),
                with_cuda=False,
                verbose=verbose,
            )
    except NativeGateUnavailable:
        raise
    except Exception as exc:  # compiler errors come as RuntimeError/CalledProcessError
        raise NativeGateUnavailable(
            f"building the launch gate extension failed ({type(exc).__name__}: {exc}); "
            f"see the build log in {build_dir}"
        ) from None
    _loaded = module
    return module


def report_build(make: Callable[[], object], what: str, error: type[Exception]) -> int:
    """Run a build for ``python -m``: say where ``what`` is ready (exit 0), or why it cannot
    be, in one line (exit 1)."""
    try:
        built = make()
    except error as exc:
        print(f"gpreempt: {exc}", file=sys.stderr)
        return 1
    print(f"gpreempt: {what} ready: {built}")
    return 0


def main() -> int:
    """Build the extension now (``python -m gpreempt.client.gate.build``)."""
    verbose = "-v" in sys.argv[1:]
    return report_build(
        lambda: load_native(verbose=verbose).__file__,
        "launch gate extension",
        NativeGateUnavailable,
    )


if __name__ == "__main__":
    raise SystemExit(main())
