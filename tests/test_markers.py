"""The request markers of server frameworks (gpreempt.client.markers), with a fake session:
which processes mark, when an ASGI request or a gRPC call opens and closes its mark, and
where each framework's hook is put."""

from __future__ import annotations

import asyncio
import collections
import types
from typing import Any

import pytest

from gpreempt.client.markers import asgi, base, grpc_server


class FakeControl:
    def __init__(self) -> None:
        self.marker = ""

    def set_marker(self, name: str) -> None:
        self.marker = name


class FakeSession:
    """Counts open requests as the real session does, and logs each enter and exit."""

    def __init__(self, priority: int = 100) -> None:
        self.priority = priority
        self.control = FakeControl()
        self.open = 0
        self.log: list[str] = []

    def enter_request(self, hint: bool = True) -> None:
        self.open += 1
        self.log.append("enter" if hint else "enter, adding to its launches")

    def exit_request(self) -> None:
        self.open -= 1
        self.log.append("exit")


@pytest.fixture
def fake(monkeypatch) -> FakeSession:
    """The process's session, high priority; wrappers made from now on mark in it."""
    current = FakeSession()
    monkeypatch.setattr(base.session, "current", lambda: current)
    monkeypatch.delenv("GPREEMPT_AUTO_REQUESTS", raising=False)
    monkeypatch.delenv("GPREEMPT_GATE_BOUND", raising=False)
    return current


# ------------------------------------------------------------------ who marks


def test_a_high_task_marks_and_names_its_marker(fake: FakeSession) -> None:
    assert base.marking_session("asgi") is fake
    assert fake.control.marker == "asgi"


def test_a_task_that_may_be_preempted_does_not_mark(fake: FakeSession) -> None:
    fake.priority = 0  # normal
    assert base.marking_session("asgi") is None
    assert fake.control.marker == ""


def test_the_gate_bound_switch_decides_as_for_the_gate(fake: FakeSession, monkeypatch) -> None:
    monkeypatch.setenv("GPREEMPT_GATE_BOUND", "1")
    assert base.marking_session("grpc") is None
    fake.priority = -100
    monkeypatch.setenv("GPREEMPT_GATE_BOUND", "0")
    assert base.marking_session("grpc") is fake


def test_one_variable_opts_out(fake: FakeSession, monkeypatch) -> None:
    monkeypatch.setenv("GPREEMPT_AUTO_REQUESTS", "0")
    assert base.marking_session("asgi") is None
    assert fake.control.marker == ""


def test_a_bad_opt_out_value_is_one_line_and_marks_nothing(
    fake: FakeSession, monkeypatch, capsys
) -> None:
    monkeypatch.setattr(base, "_warned", False)
    monkeypatch.setenv("GPREEMPT_AUTO_REQUESTS", "maybe")
    assert base.marking_session("asgi") is None
    assert base.marking_session("asgi") is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GPREEMPT_AUTO_REQUESTS" in err


def test_outside_gpreempt_nothing_is_marked(monkeypatch) -> None:
    monkeypatch.setattr(base.session, "current", lambda: None)
    monkeypatch.delenv("GPREEMPT_AUTO_REQUESTS", raising=False)
    assert base.marking_session("asgi") is None
    app = object()
    assert asgi.wrap_app(app) is app


# ------------------------------------------------------------------ ASGI


def call(app: Any, scope_type: str = "http") -> None:
    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        pass

    asyncio.run(app({"type": scope_type}, receive, send))


def recording_app(fake: FakeSession, messages: list[dict], after: bool = True) -> Any:
    """An ASGI app that sends ``messages`` and logs whether a request is open after each, and
    after returning its response (background work) if ``after``."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        fake.log.append(f"called open={fake.open}")
        for message in messages:
            await send(message)
            fake.log.append(f"sent {message['type']} open={fake.open}")
        if after:
            fake.log.append(f"background open={fake.open}")

    return app


START = {"type": "http.response.start", "status": 200, "headers": []}


def test_a_request_is_marked_until_its_last_body_part_not_its_background_work(
    fake: FakeSession,
) -> None:
    body = [
        {"type": "http.response.body", "body": b"a", "more_body": True},
        {"type": "http.response.body", "body": b"b", "more_body": True},
        {"type": "http.response.body", "body": b"", "more_body": False},
    ]
    call(asgi.wrap_app(recording_app(fake, [START, *body])))
    assert fake.log == [
        "enter",
        "called open=1",
        "sent http.response.start open=1",
        "sent http.response.body open=1",
        "sent http.response.body open=1",
        "exit",
        "sent http.response.body open=0",
        "background open=0",
    ]


def test_a_response_with_trailers_ends_with_its_last_trailers(fake: FakeSession) -> None:
    messages = [
        {**START, "trailers": True},
        {"type": "http.response.body", "body": b"a", "more_body": False},
        {"type": "http.response.trailers", "headers": [], "more_trailers": False},
    ]
    call(asgi.wrap_app(recording_app(fake, messages, after=False)))
    assert fake.log[-3:] == [
        "sent http.response.body open=1",
        "exit",
        "sent http.response.trailers open=0",
    ]


def test_a_file_sent_by_path_ends_the_response(fake: FakeSession) -> None:
    messages = [START, {"type": "http.response.pathsend", "path": "/x"}]
    call(asgi.wrap_app(recording_app(fake, messages, after=False)))
    assert fake.log[-2:] == ["exit", "sent http.response.pathsend open=0"]


def test_an_app_that_fails_or_never_answers_closes_its_mark(fake: FakeSession) -> None:
    async def failing(scope: dict, receive: Any, send: Any) -> None:
        await send(START)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        call(asgi.wrap_app(failing))
    call(asgi.wrap_app(recording_app(fake, [], after=False)))  # a client that went away
    assert fake.open == 0 and fake.log.count("enter") == 2 and fake.log.count("exit") == 2


@pytest.mark.parametrize("scope_type", ["lifespan", "websocket"])
def test_lifespans_and_websockets_are_not_requests(fake: FakeSession, scope_type: str) -> None:
    call(asgi.wrap_app(recording_app(fake, [], after=False)), scope_type)
    assert fake.log == ["called open=0"]


def test_an_app_wrapped_at_two_layers_is_marked_once(fake: FakeSession) -> None:
    inner = asgi.MarkedApp(recording_app(fake, [START], after=False), fake)  # type: ignore[arg-type]
    outer = asgi.wrap_app(inner)
    assert outer is inner  # wrapped once where one hook sees the other's wrapper
    call(asgi.MarkedApp(asgi.MarkedApp(recording_app(fake, [], False), fake), fake))  # type: ignore[arg-type]
    assert fake.log.count("enter") == 1


def test_the_wrapper_shows_the_apps_attributes(fake: FakeSession) -> None:
    app = recording_app(fake, [])
    app.state = "kept"  # type: ignore[attr-defined]
    assert asgi.wrap_app(app).state == "kept"


# ------------------------------------------------------------------ where ASGI hooks go


def test_uvicorn_wraps_the_app_it_loads(fake: FakeSession, monkeypatch) -> None:
    config_module = pytest.importorskip("uvicorn.config")
    monkeypatch.setattr(config_module.Config, "load", config_module.Config.load)  # restored
    asgi.patch_uvicorn(config_module)
    asgi.patch_uvicorn(config_module)  # once only
    app = recording_app(fake, [START], after=False)
    config = config_module.Config(app, proxy_headers=False, log_level="warning")
    config.load()
    assert isinstance(config.loaded_app, asgi.MarkedApp) and config.loaded_app.app is app
    assert fake.control.marker == "asgi"


def test_hypercorn_wraps_the_app_it_serves(fake: FakeSession, monkeypatch) -> None:
    wrappers = pytest.importorskip("hypercorn.app_wrappers")
    utils = pytest.importorskip("hypercorn.utils")
    monkeypatch.setattr(wrappers.ASGIWrapper, "__init__", wrappers.ASGIWrapper.__init__)
    asgi.patch_hypercorn(wrappers)
    app = recording_app(fake, [START], after=False)
    assert isinstance(utils.wrap_app(app, 1000, "asgi").app, asgi.MarkedApp)


@pytest.mark.parametrize("framework", ["starlette", "fastapi"])
def test_starlette_and_fastapi_apps_mark_on_any_server(
    fake: FakeSession, monkeypatch, framework: str
) -> None:
    starlette = pytest.importorskip("starlette.applications")
    responses = pytest.importorskip("starlette.responses")
    monkeypatch.setattr(
        starlette.Starlette, "build_middleware_stack", starlette.Starlette.build_middleware_stack
    )
    asgi.patch_starlette(starlette)
    if framework == "fastapi":
        fastapi = pytest.importorskip("fastapi.applications")
        stack = vars(fastapi.FastAPI).get("build_middleware_stack")
        if stack is not None:
            monkeypatch.setattr(fastapi.FastAPI, "build_middleware_stack", stack)
        asgi.patch_fastapi(fastapi)
        app = fastapi.FastAPI()
    else:
        app = starlette.Starlette()

    async def hello(request: Any) -> Any:
        fake.log.append(f"handler open={fake.open}")
        return responses.PlainTextResponse("hi")

    app.add_route("/", hello)
    scope = {
        "type": "http", "method": "GET", "path": "/", "raw_path": b"/", "root_path": "",
        "query_string": b"", "headers": [], "http_version": "1.1", "scheme": "http",
        "server": ("x", 80), "client": ("y", 1), "asgi": {"version": "3.0"},
    }  # fmt: skip

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        pass

    asyncio.run(app(scope, receive, send))
    assert fake.log == ["enter", "handler open=1", "exit"]


# ------------------------------------------------------------------ gRPC

Handler = collections.namedtuple("Handler", grpc_server.KINDS)


class FakeContext:
    """A sync servicer context: callbacks run when the RPC terminates."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []

    def add_callback(self, callback: Any) -> bool:
        self.callbacks.append(callback)
        return True

    def terminate(self) -> None:
        for callback in self.callbacks:
            callback()


def handler(**behaviors: Any) -> Any:
    return Handler(**{kind: behaviors.get(kind) for kind in grpc_server.KINDS})


def test_a_unary_call_is_marked_while_its_handler_runs(fake: FakeSession) -> None:
    def unary(request: Any, context: Any) -> str:
        fake.log.append(f"handler open={fake.open}")
        return "reply"

    marked = grpc_server.mark_handler(handler(unary_unary=unary), fake)
    context = FakeContext()
    assert marked.unary_unary("req", context) == "reply"
    context.terminate()  # closing again does nothing
    assert fake.log == ["enter", "handler open=1", "exit"]


def test_a_streamed_response_is_marked_until_it_ends(fake: FakeSession) -> None:
    def stream(request: Any, context: Any) -> Any:
        yield from range(3)

    marked = grpc_server.mark_handler(handler(unary_stream=stream), fake)
    responses = marked.unary_stream("req", FakeContext())
    assert next(responses) == 0 and fake.open == 1
    assert list(responses) == [1, 2]
    assert fake.open == 0 and fake.log == ["enter", "exit"]


def test_a_cancelled_or_failed_call_closes_its_mark(fake: FakeSession) -> None:
    def stream(request: Any, context: Any) -> Any:
        yield 0
        yield 1

    def failing(request: Any, context: Any) -> Any:
        raise ValueError("bad request")

    marked = grpc_server.mark_handler(handler(stream_stream=stream, stream_unary=failing), fake)
    context = FakeContext()
    responses = marked.stream_stream(iter(()), context)
    assert next(responses) == 0 and fake.open == 1
    context.terminate()  # the client went away: the stream is never read to its end
    assert fake.open == 0
    with pytest.raises(ValueError):
        marked.stream_unary(iter(()), FakeContext())
    assert fake.open == 0 and fake.log == ["enter", "exit", "enter", "exit"]


def test_asyncio_handlers_are_marked_and_stay_coroutines(fake: FakeSession) -> None:
    async def unary(request: Any, context: Any) -> str:
        fake.log.append(f"unary open={fake.open}")
        return "reply"

    async def stream(request: Any, context: Any) -> Any:
        for i in range(2):
            fake.log.append(f"stream open={fake.open}")
            yield i

    marked = grpc_server.mark_handler(handler(unary_unary=unary, unary_stream=stream), fake)

    async def run() -> list[Any]:
        context = types.SimpleNamespace(add_done_callback=lambda callback: None)
        got = [await marked.unary_unary("req", context)]
        got += [item async for item in marked.unary_stream("req", context)]
        return got

    assert asyncio.run(run()) == ["reply", 0, 1]
    assert fake.log == [
        "enter", "unary open=1", "exit", "enter", "stream open=1", "stream open=1", "exit",
    ]  # fmt: skip


def test_handlers_that_are_not_grpcs_own_are_left_alone(fake: FakeSession) -> None:
    odd = types.SimpleNamespace(unary_unary=lambda request, context: None)
    assert grpc_server.mark_handler(odd, fake) is odd
    assert grpc_server.mark_handler(None, fake) is None


def test_servers_get_the_marking_interceptor_first(fake: FakeSession) -> None:
    made: list[tuple[str, list[Any]]] = []

    def server(thread_pool: Any, handlers: Any = None, interceptors: Any = None) -> str:
        made.append(("sync", list(interceptors or ())))
        return "server"

    def aio_server(migration_thread_pool: Any = None, handlers: Any = None, interceptors=None):
        made.append(("aio", list(interceptors or ())))
        return "aio server"

    fake_grpc = types.SimpleNamespace(
        server=server,
        ServerInterceptor=object,
        aio=types.SimpleNamespace(server=aio_server, ServerInterceptor=object),
    )
    grpc_server.patch_grpc(fake_grpc)  # type: ignore[arg-type]
    grpc_server.patch_grpc(fake_grpc)  # type: ignore[arg-type]  # once only
    assert fake_grpc.server("pool", None, ["theirs"]) == "server"
    assert fake_grpc.aio.server() == "aio server"
    (_, sync), (_, aio) = made
    assert type(sync[0]).__name__ == "MarkRequests" and sync[1:] == ["theirs"]
    assert type(aio[0]).__name__ == "MarkRequestsAio" and len(aio) == 1
    assert fake.control.marker == "grpc"
    fake.priority = 0
    fake_grpc.server("pool")
    assert made[-1] == ("sync", [])  # a task that may be preempted marks nothing


# ------------------------------------------------------------------ the agent, the daemon, status


def test_the_agent_arms_every_server_hook_on_import() -> None:
    from gpreempt.client import agent, markers

    assert set(markers.SERVER_HOOKS) <= set(agent.ON_IMPORT)


def test_a_hook_that_fails_costs_one_line(capsys, monkeypatch) -> None:
    from gpreempt.client import agent, markers

    monkeypatch.delenv("GPREEMPT_AUTO_REQUESTS", raising=False)
    agent.on_server_imported(types.ModuleType("uvicorn.config"))  # no Config in it
    err = capsys.readouterr().err
    assert (
        err.startswith("gpreempt: requests of uvicorn.config not marked") and err.count("\n") == 1
    )
    monkeypatch.setenv("GPREEMPT_AUTO_REQUESTS", "0")
    agent.on_server_imported(types.ModuleType("uvicorn.config"))  # opted out: not even patched
    assert capsys.readouterr().err == ""
    assert markers.ENV_AUTO_REQUESTS == "GPREEMPT_AUTO_REQUESTS"


def test_the_control_block_carries_the_marker() -> None:
    from gpreempt.control_block import ControlBlock

    block = ControlBlock.create()
    try:
        assert block.marker == ""
        block.set_marker("grpc")
        assert block.marker == "grpc"
        with pytest.raises(ValueError):
            block.set_marker("wsgi")
    finally:
        block.close()


def test_a_task_names_what_marks_it(monkeypatch) -> None:
    from gpreempt.daemon.task import Task
    from gpreempt.daemon.task_identity import TaskIdentity

    def control(marker: str = "", hinted: bool = False, gate: bool = False) -> Any:
        return types.SimpleNamespace(marker=marker, hinted=hinted, gate_installed=gate)

    task = Task(TaskIdentity(1, 10, None, 0, 0, "srv", 100, (0,), "auto"))
    assert task.marker == "none"
    task.controls = {1: control(gate=True)}
    assert task.marker == "launches"
    task.controls[2] = control(hinted=True)
    assert task.marker == "request()"
    task.controls[3] = control("asgi", hinted=True)  # its front-end process
    assert task.marker == "asgi"
    identity = TaskIdentity(1, 10, None, 0, 0, "srv", 100, (0,), "auto", always_active=True)
    task = Task(identity, controls=task.controls)
    assert task.marker == "asgi"
    task.controls = {}
    assert task.marker == "always"


def test_status_shows_the_marker(capsys, monkeypatch) -> None:
    from gpreempt.cli.status import print_status

    monkeypatch.setenv("COLUMNS", "200")
    daemon = {"pid": 1, "policy": "hpf", "runtime_dir": "/tmp/x", "lock_available": True}
    server = {
        "pid": 9, "name": "srv", "priority": 100, "priority_name": "high", "gpus": [0],
        "mechanism": "auto", "state": "running", "active": False, "preemptions": 0,
        "suspended_seconds": 0.0, "last_suspend_ms": None, "last_mechanism": None,
        "marker": "asgi",
    }  # fmt: skip
    print_status({"daemon": daemon, "tasks": [server]})
    out = capsys.readouterr().out
    assert "active/by" in out and "no/asgi" in out


# ------------------------------------------------------------------ Hugging Face generate


def generation_module() -> types.ModuleType:
    """A stand-in for ``transformers.generation.utils``: a mixin whose generate logs how many
    requests are open while it decodes."""
    module = types.ModuleType("transformers.generation.utils")

    class GenerationMixin:
        def generate(self, prompt: str, *, fail: bool = False, log: list | None = None) -> str:
            if log is not None:
                log.append("decoding")
            if fail:
                raise RuntimeError("out of memory")
            return prompt + "!"

    module.GenerationMixin = GenerationMixin  # type: ignore[attr-defined]
    return module


def test_a_generate_call_is_one_request(fake: FakeSession) -> None:
    from gpreempt.client.markers import generate

    module = generation_module()
    generate.patch_generation(module)
    generate.patch_generation(module)  # armed twice: wrapped once
    model = module.GenerationMixin()
    assert model.generate("hi", log=fake.log) == "hi!"
    # a part of a request (its copies come before and after): the launches still count
    assert fake.log == ["enter, adding to its launches", "decoding", "exit"]
    assert fake.control.marker == "generate"
    with pytest.raises(RuntimeError):
        model.generate("hi", fail=True)
    assert fake.open == 0 and fake.log[-1] == "exit"
    assert module.GenerationMixin.generate.__name__ == "generate"


def test_a_low_tasks_generate_calls_are_not_requests(fake: FakeSession) -> None:
    from gpreempt.client.markers import generate

    fake.priority = -100  # its rollouts do not make it more important than it is
    module = generation_module()
    generate.patch_generation(module)
    assert module.GenerationMixin().generate("hi") == "hi!"
    assert fake.log == []


def test_a_module_without_the_mixin_is_one_line(capsys, monkeypatch) -> None:
    from gpreempt.client import agent

    monkeypatch.delenv("GPREEMPT_AUTO_REQUESTS", raising=False)
    agent.on_server_imported(types.ModuleType("transformers.generation.utils"))
    err = capsys.readouterr().err
    assert "not marked" in err and err.count("\n") == 1
