"""Request boundaries without code: the requests of a server that a framework runs are marked
as ``gpreempt.request()`` marks them, in the processes of a task that preempts others.

``gpreempt run`` arms these hooks through :mod:`..agent`: once one of :data:`SERVER_HOOKS`'s
modules is imported, its hook wraps what that framework calls for each request.

- :mod:`.asgi`: every HTTP request of an ASGI application (Starlette, FastAPI, LitServe, the
  HTTP front-ends of vLLM and SGLang...), from the moment the server hands it to the app until
  its last response body is sent; wrapped where the server loads its app (uvicorn's
  ``Config.load``, hypercorn's ``ASGIWrapper``) and, for servers without such a hook, where a
  Starlette or FastAPI app builds its middleware stack.
- :mod:`.grpc_server`: every RPC of a ``grpc.server(...)`` or ``grpc.aio.server(...)``, through
  a server interceptor put first, until its handler returned (unary) or its response stream
  ended.
- :mod:`.generate`: every call of Hugging Face ``generate`` (``transformers``'
  ``GenerationMixin``), from its start until it returns: servers that decode in a loop of
  their own.

A request is marked only in a process whose task preempts others (its launch gate is
unbounded: ``high`` priority or above, unless ``GPREEMPT_GATE_BOUND`` says otherwise), and not
at all with ``GPREEMPT_AUTO_REQUESTS=0``. The process's control block then says which framework
marks its requests (``gpreempt status``: ``asgi``, ``grpc``, ``generate``). Marking a process
marks its task:
the daemon counts a task active while any of its processes is.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from .base import ENV_AUTO_REQUESTS, Mark, enabled, marking_session, preempts_others

__all__ = [
    "ENV_AUTO_REQUESTS",
    "SERVER_HOOKS",
    "Mark",
    "arm",
    "enabled",
    "marking_session",
    "preempts_others",
]


def _asgi_hook(name: str) -> Callable[[ModuleType], None]:
    def hook(module: ModuleType) -> None:
        from . import asgi

        asgi.PATCHES[name](module)

    return hook


def _grpc_hook(module: ModuleType) -> None:
    from . import grpc_server

    grpc_server.patch_grpc(module)


def _generate_hook(module: ModuleType) -> None:
    from . import generate

    generate.patch_generation(module)


#: Module whose import arms a framework's hook -> the hook (given the module).
SERVER_HOOKS: dict[str, Callable[[ModuleType], None]] = {
    "uvicorn.config": _asgi_hook("uvicorn.config"),
    "hypercorn.app_wrappers": _asgi_hook("hypercorn.app_wrappers"),
    "starlette.applications": _asgi_hook("starlette.applications"),
    "fastapi.applications": _asgi_hook("fastapi.applications"),
    "grpc": _grpc_hook,
    "transformers.generation.utils": _generate_hook,
}


def arm(module: ModuleType) -> None:
    """Run the hook of ``module`` (one of :data:`SERVER_HOOKS`), unless opted out."""
    if enabled():
        SERVER_HOOKS[module.__name__](module)
