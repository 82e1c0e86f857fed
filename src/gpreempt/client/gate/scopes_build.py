"""Building the native request counter (``csrc/request_scopes.cpp``, used by
:mod:`gpreempt.client.native_scopes`).

The library is plain C++ with no dependencies, compiled once per user and source (under a
second with g++) into the same cache as the gates (:func:`.build.cache_root`), under their build
lock and ownership check (:func:`.build.compile_library`). ``gpreempt run`` builds it before it
starts the command (:func:`build_ahead`); a process that cannot build or load it keeps the
Python linger. Build it ahead of time (a container image) with
``python -m gpreempt.client.gate.scopes_build``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from .build import CSRC, NativeGateUnavailable, build_plain_library, report_build

SOURCE = CSRC / "request_scopes.cpp"
HEADERS = (CSRC / "gate_words.h", CSRC / "control_layout.h")
LIBRARY_PREFIX = "libgpreempt_scopes_"


class ScopesUnavailable(NativeGateUnavailable):
    """The native counter cannot be built or loaded here; the message says why, in one line."""


def build() -> Path:
    """The built library (compiled now if not cached); raises ScopesUnavailable."""
    return build_plain_library(  # the library runs in every process that marks requests
        "the request counter", "request_scopes", LIBRARY_PREFIX, (SOURCE,), HEADERS,
        ScopesUnavailable, includes=(CSRC,), link=("-lpthread", "-Wl,-z,defs"),
    )  # fmt: skip


def build_ahead() -> None:
    """Build the library now if it can be (``gpreempt run``, before the command starts), so
    that no request waits for the compiler; where it cannot, the Python linger counts."""
    with contextlib.suppress(ScopesUnavailable):
        build()


def main() -> int:
    """Build the library now (``python -m gpreempt.client.gate.scopes_build``)."""
    return report_build(build, "request counter", ScopesUnavailable)


if __name__ == "__main__":
    raise SystemExit(main())
