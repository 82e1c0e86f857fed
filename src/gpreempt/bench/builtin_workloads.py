"""The built-in benchmark workloads (torch, or CuPy, is imported only when one is built):

- Case-A, online inference: :func:`resnet50_server`, torchvision ResNet-50 with random weights
  (nothing is downloaded), fp16, channels-last, replayed from a CUDA graph; one request copies a
  pinned input batch in, replays the graph and copies the logits out.
- Case-B, offline training: :func:`transformer_trainer`, an 8-layer Transformer encoder
  (d=1024, 16 heads, batch 16x512) in eager PyTorch with bf16 autocast and AdamW; its variants
  (:data:`CASE_B_KINDS`); :func:`cupy_trainer`, a GEMM loop in CuPy, and :func:`jax_trainer`, an
  MLP's training step under ``jax.jit``, each alone in its process or beside an ``import torch``.
- :class:`TorchMemory`: device memory through torch, for the memory-pressure scenarios.

:mod:`.workloads` runs them as the benchmark's processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Case-A variants: name -> ResNet-50 batch size (``eager``: batch 8, no CUDA graph).
CASE_A_BATCH = {"light": 8, "heavy": 64, "eager": 8}
#: Case-B variants (``--case-b``): the Transformer as most people write it (eager), reading its
#: loss every step (which synchronises), compiled with ``torch.compile``; a CuPy GEMM loop and a
#: JAX training step, alone or in a process that also imports PyTorch (``-torch``: for its
#: DataLoader, say), where PyTorch's operator hook sees none of their launches.
CASE_B_KINDS = (
    "transformer",
    "transformer-sync",
    "transformer-compiled",
    "cupy",
    "cupy-torch",
    "jax",
    "jax-torch",
)


def resnet50_server(
    batch: int = 8, device: str = "cuda", graph: bool = True, cudnn_benchmark: bool = False
) -> Callable[[], None]:
    """Case-A: one call serves one request of ``batch`` 224x224 images on ResNet-50 fp16.
    From a CUDA graph, the handler keeps each request's GPU span (ms, from timed events before
    its input's copy and after its output's) in its ``gpu_ms`` list (``loops.GPU_MS``).
    ``cudnn_benchmark``: cuDNN times its convolution algorithms at the first requests and keeps
    the fastest; off, it picks them by its heuristics, the same in every process. Off by
    default: the timed choice moved the server's speed from one start of its process to the
    next, and with what else ran on the GPU meanwhile (``benchmarks/driver_gate/server_spread.py``),
    so a scenario's server ran other kernels than the alone one it is read against."""
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = cudnn_benchmark
    dev = torch.device(device)
    on_gpu = dev.type == "cuda"
    dtype = torch.float16 if on_gpu else torch.float32
    model = torchvision.models.resnet50(weights=None).to(dev, dtype).eval()
    model = model.to(memory_format=torch.channels_last)
    host_in = torch.randn(batch, 3, 224, 224, dtype=dtype).contiguous(
        memory_format=torch.channels_last
    )
    if on_gpu:
        host_in = host_in.pin_memory()
    static_in = torch.empty_like(host_in, device=dev)
    static_in.copy_(host_in)
    host_out = torch.empty(batch, 1000, dtype=dtype, pin_memory=on_gpu)

    with torch.inference_mode():
        if on_gpu and graph:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    model(static_in)
            torch.cuda.current_stream().wait_stream(side)
            cuda_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cuda_graph):
                static_out = model(static_in)
            torch.cuda.synchronize()
            begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            gpu_ms: list[float] = []

            def request() -> None:
                stream = torch.cuda.current_stream()
                begin.record(stream)
                static_in.copy_(host_in, non_blocking=True)
                cuda_graph.replay()
                host_out.copy_(static_out, non_blocking=True)
                end.record(stream)
                stream.synchronize()
                gpu_ms.append(begin.elapsed_time(end))

            request.gpu_ms = gpu_ms  # type: ignore[attr-defined]
            return request

    def eager_request() -> None:
        with torch.inference_mode():
            out = model(host_in.to(dev, non_blocking=True))
            host_out.copy_(out)

    return eager_request


def transformer_trainer(
    d_model: int = 1024,
    layers: int = 8,
    batch: int = 16,
    seq: int = 512,
    device: str = "cuda",
    sync_loss: bool = False,
    compiled: bool = False,
) -> Callable[[], Any]:
    """Case-B: one call queues one training step; returns an event that completes with it.

    ``sync_loss``: read the loss every step (``loss.item()``, as loops that log it do), which
    waits for the step; ``compiled``: the model under ``torch.compile``."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    dev = torch.device(device)
    on_gpu = dev.type == "cuda"
    layer = torch.nn.TransformerEncoderLayer(
        d_model, nhead=16, dim_feedforward=4 * d_model, batch_first=True, norm_first=True
    )
    model = torch.nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
    model = model.to(dev).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    forward = torch.compile(model) if compiled else model
    x = torch.randn(batch, seq, d_model, device=dev)
    target = torch.randn(batch, seq, d_model, device=dev)
    losses: list[float] = []
    if on_gpu:
        torch.cuda.synchronize()

    def step() -> Any:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            out = forward(x)
        loss = F.mse_loss(out.float(), target)
        loss.backward()
        optimizer.step()
        if sync_loss:
            losses.append(loss.item())
            return None
        if on_gpu:
            event = torch.cuda.Event(blocking=True)
            event.record()
            return event
        return None

    return step


class TorchMemory:
    """Device memory through torch: blocks are uint8 tensors, written once so they are real."""

    def __init__(self, device: str = "cuda") -> None:
        import torch

        self._torch = torch
        self.device = torch.device(device)

    def free_bytes(self) -> int:
        return int(self._torch.cuda.mem_get_info(self.device)[0])

    def allocate(self, nbytes: int) -> Any:
        torch = self._torch
        try:
            block = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        except torch.cuda.OutOfMemoryError as exc:
            raise MemoryError(str(exc)) from None
        block.fill_(1)
        return block

    def release(self, blocks: list[Any]) -> None:
        blocks.clear()
        self._torch.cuda.synchronize(self.device)
        self._torch.cuda.empty_cache()  # back to the driver, not only to torch's cache


def _with_torch() -> None:
    """Import PyTorch and start its CUDA, as a process that uses it beside another framework."""
    import torch

    torch.zeros(1, device="cuda")


def cupy_trainer(n: int = 4096, gemms: int = 48, with_torch: bool = False) -> Callable[[], Any]:
    """Case-B in CuPy: one call queues ``gemms`` fp16 GEMMs of n x n and returns an event that
    completes with them (the loop runs ahead as such loops do)."""
    if with_torch:
        _with_torch()
    import cupy as cp

    rng = cp.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
    b = rng.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
    out = cp.empty_like(a)
    cp.cuda.Device().synchronize()

    def step() -> Any:
        for _ in range(gemms):
            cp.matmul(a, b, out=out)
        event = cp.cuda.Event(block=True)
        event.record()
        return event

    return step


class _Ready:
    """A step's token for JAX: completes with the arrays it holds."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def synchronize(self) -> None:
        import jax

        jax.block_until_ready(self.value)


def jax_trainer(
    width: int = 4096, layers: int = 4, batch: int = 2048, with_torch: bool = False
) -> Callable[[], Any]:
    """Case-B in JAX: one call dispatches one SGD step of an MLP (``layers`` of ``width``,
    bf16, ``batch`` rows) compiled with ``jax.jit`` and returns a token that completes with it.
    JAX is told not to take most of the GPU's memory up front (it shares the GPU)."""
    import os

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if with_torch:
        _with_torch()
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(0), layers + 2)
    params = [
        jax.random.normal(k, (width, width), jnp.bfloat16) * (width**-0.5) for k in keys[:layers]
    ]
    x = jax.random.normal(keys[-2], (batch, width), jnp.bfloat16)
    y = jax.random.normal(keys[-1], (batch, width), jnp.bfloat16)

    def loss(params: list[Any], x: Any, y: Any) -> Any:
        for w in params:
            x = jnp.tanh(x @ w)
        return jnp.mean((x.astype(jnp.float32) - y.astype(jnp.float32)) ** 2)

    @jax.jit
    def update(params: list[Any], x: Any, y: Any) -> list[Any]:
        grads = jax.grad(loss)(params, x, y)
        return [w - 1e-3 * g for w, g in zip(params, grads, strict=True)]

    state = {"params": params}

    def step() -> Any:
        state["params"] = update(state["params"], x, y)
        return _Ready(state["params"])

    return step
