"""Case-A servers as people run them, for ``gpreempt bench --case-a-fn MODULE:FACTORY``.

Each factory takes no arguments (the bench calls it so) and returns a callable that serves one
request and returns once its answer is on the host:

- :func:`resnet_eager`: ResNet-50 fp16 batch 8 in eager PyTorch (no CUDA graph), as
  ``--case-a eager``.
- :func:`gpt2_generate`: Hugging Face ``generate`` of a GPT-2 built from its config (random
  weights: nothing is downloaded), greedy, 8 new tokens after a 32-token prompt.
- :func:`http`, :func:`http_unmarked`, :func:`http_by_hand`: the eager ResNet-50 (or the
  handler ``GPREEMPT_BENCH_HTTP_FN`` names, e.g. :func:`gpt2_generate`) behind a FastAPI app
  under uvicorn, in a process of its own (:mod:`.http_server`), and a request is one HTTP
  POST to it: its requests marked by gpreempt with no code, not marked at all
  (``GPREEMPT_AUTO_REQUESTS=0``: only its GPU work says it is active), or with
  ``gpreempt.request()`` written around the handler by hand.

Served under ``--scenarios gpreempt-no-request`` (the bench's loop marks nothing), the HTTP
variants compare the markers alone. Settings from the environment, so that the bench's
processes all get them: ``GPREEMPT_BENCH_DEVICE`` (default ``cuda`` where there is one, else
``cpu``), ``GPREEMPT_BENCH_BATCH`` (ResNet-50's, 8), ``GPREEMPT_BENCH_NEW_TOKENS`` (8),
``GPREEMPT_BENCH_LM`` (``gpt2``, or ``tiny``: 2 layers of 64, a CPU stand-in) and
``GPREEMPT_BENCH_HTTP_FN`` (the HTTP server's handler, default :func:`resnet_eager`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from ..config import env_number
from ..errors import UsageError
from .builtin_workloads import resnet50_server

ENV_DEVICE = "GPREEMPT_BENCH_DEVICE"
ENV_BATCH = "GPREEMPT_BENCH_BATCH"
ENV_NEW_TOKENS = "GPREEMPT_BENCH_NEW_TOKENS"
ENV_LM = "GPREEMPT_BENCH_LM"
ENV_HTTP_FN = "GPREEMPT_BENCH_HTTP_FN"
#: The HTTP server's handler unless ``GPREEMPT_BENCH_HTTP_FN`` names another.
DEFAULT_HTTP_FN = "gpreempt.bench.servers:resnet_eager"
PROMPT_TOKENS = 32


def device() -> str:
    """``$GPREEMPT_BENCH_DEVICE``, else ``cuda`` where PyTorch sees a GPU, else ``cpu``."""
    chosen = os.environ.get(ENV_DEVICE, "").strip()
    if chosen:
        return chosen
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _whole(name: str, default: int) -> int:
    value = env_number(name, int, 1)
    return default if value is None else int(value)


def resnet_eager() -> Callable[[], None]:
    """ResNet-50 batch ``GPREEMPT_BENCH_BATCH`` (8), eager: no CUDA graph."""
    return resnet50_server(batch=_whole(ENV_BATCH, 8), device=device(), graph=False)


def gpt2_generate() -> Callable[[], Any]:
    """Greedy ``generate`` of ``GPREEMPT_BENCH_NEW_TOKENS`` (8) tokens after a 32-token
    prompt, by GPT-2 (124M) with random weights, or a 2-layer stand-in
    (``GPREEMPT_BENCH_LM=tiny``)."""
    import torch

    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        raise UsageError("gpt2_generate needs transformers: pip install transformers") from None
    kind = os.environ.get(ENV_LM, "gpt2").strip() or "gpt2"
    sizes = {"gpt2": {}, "tiny": {"n_layer": 2, "n_embd": 64, "n_head": 2}}
    if kind not in sizes:
        raise UsageError(f"{ENV_LM}={kind!r}: choose gpt2 or tiny")
    config = GPT2Config(**sizes[kind], bos_token_id=None, eos_token_id=None)
    dev = torch.device(device())
    dtype = torch.float16 if dev.type == "cuda" else torch.float32
    model = GPT2LMHeadModel(config).to(dev, dtype).eval()
    new_tokens = _whole(ENV_NEW_TOKENS, 8)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, config.vocab_size, (1, PROMPT_TOKENS), generator=generator)
    options = {
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
        "do_sample": False,
        "pad_token_id": 0,
    }

    def request() -> list[int]:
        with torch.inference_mode():
            ids = prompt.to(dev, non_blocking=True)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **options)
            return out[0, PROMPT_TOKENS:].tolist()  # on the host: the answer is ready

    return request


def cpu_work(ms: float = 2.0) -> Callable[[], None]:
    """A request of ``ms`` milliseconds of Python on the CPU: the HTTP server's stand-in
    handler where there is no GPU (tests)."""

    def request() -> None:
        end = time.perf_counter() + ms / 1000.0
        while time.perf_counter() < end:
            pass

    return request


def _http(marking: str) -> Callable[[], Any]:
    from .http_server import start_client

    fn = os.environ.get(ENV_HTTP_FN, "").strip() or DEFAULT_HTTP_FN
    return start_client(fn, marking)


def http() -> Callable[[], Any]:
    """The eager ResNet-50 (``GPREEMPT_BENCH_HTTP_FN``) over HTTP, its requests marked by
    gpreempt with no code."""
    return _http("auto")


def http_unmarked() -> Callable[[], Any]:
    """The same with ``GPREEMPT_AUTO_REQUESTS=0``: nothing marks its requests."""
    return _http("off")


def http_by_hand() -> Callable[[], Any]:
    """The same with ``gpreempt.request()`` around its handler, written by hand (and the
    automatic marker off)."""
    return _http("hand")
