"""Marking each HTTP request of an ASGI application (:class:`MarkedApp`), and where it is put.

The hook is the app the server runs, wrapped once where the server loads it, because that is
where every request passes whatever the framework, and the servers keep it stable:

- uvicorn: ``Config.load()`` sets ``Config.loaded_app``, the app its protocols call for every
  connection (``uvicorn.run``, ``uvicorn.Server``, ``--workers``, gunicorn's worker, vLLM's and
  SGLang's front-ends all go through it); WSGI apps are wrapped into ASGI by then.
- hypercorn: ``ASGIWrapper`` holds the app for both its asyncio and trio workers.
- Starlette and FastAPI (hence LitServe): ``build_middleware_stack()``, which the app calls
  once before its first request, for servers that offer no such hook (granian, daphne...).

An app met by two of these (a FastAPI app under uvicorn) is marked once: the inner wrapper
sees that its request is marked already (a context variable, which the request's tasks
inherit). Only ``http`` scopes are marked: a lifespan lasts as long as the server and a
WebSocket as long as its connection, so neither says when the GPU is wanted (mark those with
``gpreempt.request()``).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from types import ModuleType
from typing import Any

from .. import session
from .base import Mark, marking_session

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

#: Set inside a request that an outer wrapper marks already.
_marked: ContextVar[bool] = ContextVar("gpreempt_request_marked", default=False)
#: Attribute that says a function was wrapped here already.
_WRAPPED = "__gpreempt_marks_requests__"


def last_message(message: Message, trailers: bool) -> bool:
    """Whether ``message``, sent by the app, ends its HTTP response: the body's last part
    (also of the zero-copy and path-send extensions), or the last trailers where the response
    announced trailers."""
    kind = message.get("type")
    if trailers:
        return kind == "http.response.trailers" and not message.get("more_trailers", False)
    if kind in ("http.response.body", "http.response.zerocopysend"):
        return not message.get("more_body", False)
    return kind == "http.response.pathsend"


class MarkedApp:
    """An ASGI application that marks each HTTP request of ``app`` in ``current``, from the
    call (the request arrived) until its response's last message was sent, or the app
    returned, whichever comes first: a streamed response stays marked until it ends, and
    background tasks run after the response are not marked."""

    def __init__(self, app: Any, current: session.Session) -> None:
        self.app = app
        self._session = current

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)  # servers may read the app's own attributes

    async def __call__(self, scope: Message, receive: Any, send: Send) -> None:
        if scope.get("type") != "http" or _marked.get():
            await self.app(scope, receive, send)
            return
        mark = Mark(self._session)
        token = _marked.set(True)
        trailers = False

        async def marked_send(message: Message) -> None:
            nonlocal trailers
            if message.get("type") == "http.response.start":
                trailers = bool(message.get("trailers", False))
            await send(message)
            if last_message(message, trailers):
                mark.close()

        try:
            await self.app(scope, receive, marked_send)
        finally:
            _marked.reset(token)
            mark.close()


def wrap_app(app: Any) -> Any:
    """``app``, marked if this process's requests are to be marked (:func:`marking_session`)."""
    if isinstance(app, MarkedApp):
        return app
    current = marking_session("asgi")
    return app if current is None else MarkedApp(app, current)


def _patch(owner: type, name: str, make: Callable[[Any], Any]) -> None:
    """Replace ``owner.name`` by ``make(original)``, once."""
    original = getattr(owner, name)
    if getattr(original, _WRAPPED, False):
        return
    patched = functools.wraps(original)(make(original))
    setattr(patched, _WRAPPED, True)
    setattr(owner, name, patched)


def patch_uvicorn(module: ModuleType) -> None:
    """uvicorn (``uvicorn.config``): wrap ``Config.loaded_app`` once ``Config.load()`` set it."""

    def make(original: Callable[[Any], None]) -> Callable[[Any], None]:
        def load(self: Any) -> None:
            original(self)
            self.loaded_app = wrap_app(self.loaded_app)

        return load

    _patch(module.Config, "load", make)


def patch_hypercorn(module: ModuleType) -> None:
    """hypercorn (``hypercorn.app_wrappers``): wrap the app an ``ASGIWrapper`` holds."""

    def make(original: Callable[..., None]) -> Callable[..., None]:
        def init(self: Any, app: Any, *args: Any, **kwargs: Any) -> None:
            original(self, app, *args, **kwargs)
            self.app = wrap_app(self.app)

        return init

    _patch(module.ASGIWrapper, "__init__", make)


def _patch_stack(cls: type) -> None:
    def make(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def build_middleware_stack(self: Any) -> Any:
            return wrap_app(original(self))

        return build_middleware_stack

    _patch(cls, "build_middleware_stack", make)


def patch_starlette(module: ModuleType) -> None:
    """Starlette (``starlette.applications``): wrap the middleware stack an app builds."""
    _patch_stack(module.Starlette)


def patch_fastapi(module: ModuleType) -> None:
    """FastAPI (``fastapi.applications``), which builds its own middleware stack."""
    if "build_middleware_stack" in vars(module.FastAPI):
        _patch_stack(module.FastAPI)


#: Module -> its patch (:data:`gpreempt.client.markers.SERVER_HOOKS`).
PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "uvicorn.config": patch_uvicorn,
    "hypercorn.app_wrappers": patch_hypercorn,
    "starlette.applications": patch_starlette,
    "fastapi.applications": patch_fastapi,
}
