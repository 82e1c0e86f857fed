"""Marking each RPC of a gRPC server (``grpcio``), through a server interceptor.

``grpc.server(...)`` and ``grpc.aio.server(...)`` are wrapped so that every server they make
gets one more interceptor, first in the list (so the others' work counts as the request's
too). It wraps the RPC's handler: a request is marked from the call of the handler (its
request has arrived) until the handler returned (unary response), or its response stream
ended (streamed response), or the RPC terminated (cancelled), whichever comes first, as
``with gpreempt.request():`` around the handler's body would. Handlers that gRPC describes
otherwise than by its own ``RpcMethodHandler`` are left alone.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from .. import session
from .base import Mark, marking_session

#: The handler kinds of a ``grpc.RpcMethodHandler``; a ``*_stream`` one streams its responses.
KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
_WRAPPED = "__gpreempt_marks_requests__"


def _close_when_done(context: Any, mark: Mark) -> None:
    """Close ``mark`` when the RPC terminates, if ``context`` can tell (sync and asyncio
    servicer contexts name this differently)."""
    add_done = getattr(context, "add_done_callback", None)  # grpc.aio: callback(context)
    if callable(add_done):
        add_done(lambda _context: mark.close())
        return
    add = getattr(context, "add_callback", None)  # grpc: callback()
    if callable(add):
        add(mark.close)


class _MarkedIterator:
    """A streamed response that closes its request's mark once it ends, fails, or is closed."""

    def __init__(self, responses: Any, mark: Mark) -> None:
        self._responses: Iterator[Any] = iter(responses)
        self._mark = mark

    def __iter__(self) -> _MarkedIterator:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._responses)
        except BaseException:
            self._mark.close()
            raise

    def close(self) -> None:
        self._mark.close()
        close = getattr(self._responses, "close", None)
        if callable(close):
            close()


def _marked(behavior: Callable[..., Any], current: session.Session, streams: bool) -> Any:
    """``behavior`` (one handler of an RPC), marking each call in ``current``."""
    if inspect.isasyncgenfunction(behavior):

        async def marked_stream(request: Any, context: Any) -> Any:
            mark = Mark(current)
            _close_when_done(context, mark)
            try:
                async for response in behavior(request, context):
                    yield response
            finally:
                mark.close()

        return marked_stream
    if inspect.iscoroutinefunction(behavior):

        async def marked_coroutine(request: Any, context: Any) -> Any:
            mark = Mark(current)
            _close_when_done(context, mark)
            try:
                return await behavior(request, context)
            finally:
                mark.close()

        return marked_coroutine

    def marked_call(request: Any, context: Any) -> Any:
        mark = Mark(current)
        _close_when_done(context, mark)
        try:
            result = behavior(request, context)
        except BaseException:
            mark.close()
            raise
        if streams and result is not None:
            return _MarkedIterator(result, mark)
        mark.close()
        return result

    return marked_call


def mark_handler(handler: Any, current: session.Session) -> Any:
    """``handler`` (a ``grpc.RpcMethodHandler``) with each of its behaviours marked."""
    replace = getattr(handler, "_replace", None)  # grpc's handlers are named tuples
    if handler is None or not callable(replace):
        return handler
    changes = {}
    for kind in KINDS:
        behavior = getattr(handler, kind, None)
        if behavior is not None:
            changes[kind] = _marked(behavior, current, streams=kind.endswith("_stream"))
    return replace(**changes)


def interceptors(grpc: ModuleType, current: session.Session) -> tuple[Any, Any]:
    """The interceptors that mark RPCs in ``current``: one for ``grpc.server`` and one for
    ``grpc.aio.server`` (which takes only its own kind)."""

    class MarkRequests(grpc.ServerInterceptor):  # type: ignore[name-defined,misc]
        def intercept_service(self, continuation: Any, details: Any) -> Any:
            return mark_handler(continuation(details), current)

    class MarkRequestsAio(grpc.aio.ServerInterceptor):  # type: ignore[name-defined,misc]
        async def intercept_service(self, continuation: Any, details: Any) -> Any:
            return mark_handler(await continuation(details), current)

    return MarkRequests(), MarkRequestsAio()


def _wrap_server(factory: Callable[..., Any], grpc: ModuleType, aio: bool) -> Callable[..., Any]:
    signature = inspect.signature(factory)

    @functools.wraps(factory)
    def server(*args: Any, **kwargs: Any) -> Any:
        current = marking_session("grpc")
        if current is None:
            return factory(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        ours = interceptors(grpc, current)[1 if aio else 0]
        bound.arguments["interceptors"] = [ours, *(bound.arguments.get("interceptors") or ())]
        return factory(*bound.args, **bound.kwargs)

    setattr(server, _WRAPPED, True)
    return server


def patch_grpc(grpc: ModuleType) -> None:
    """Wrap ``grpc.server`` and ``grpc.aio.server`` (``grpc`` imports ``grpc.aio`` itself)."""
    if not getattr(grpc.server, _WRAPPED, False):
        grpc.server = _wrap_server(grpc.server, grpc, aio=False)
    aio = getattr(grpc, "aio", None)
    if aio is not None and not getattr(aio.server, _WRAPPED, False):
        aio.server = _wrap_server(aio.server, grpc, aio=True)
