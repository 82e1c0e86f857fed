"""End-to-end checks of the driver lock and memory eviction on an NVIDIA GPU.

    python benchmarks/validate/validate_gpu.py all --out OUTDIR

1. lock under `gpreempt run`: a PyTorch training run is suspended and resumed 120 times by
   hand; it must stop progressing while suspended and end with weights bit-identical to an
   undisturbed run with the same seed (a second undisturbed run is the determinism control).
2. lock under `gpreempt attach`: the same for an already running PyTorch process and for a
   CuPy loop (a CUDA program that is not PyTorch); and the CuPy loop under `gpreempt run`.
   Mechanism auto on a PyTorch process whose kernels CuPy launches (its gate cannot see them):
   the driver lock behind the gate stops them, and without it (--backstop-ms 0) they run on.
3. memory: a high-priority process with --reserve-memory needs more GPU memory than is
   free beside a training run; the daemon evicts the training run, the high-priority process
   allocates and finishes, the training run is restored and ends bit-identical.
4. eviction and restore rates (GB/s) for several footprints, beside the host-device copy
   bandwidth (pinned and pageable) measured in the same run.

Writes OUTDIR/validate.json and prints a summary table last.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]


# ---------------------------------------------------------------------- workloads
def write_progress(path: Path, text: str) -> None:
    """Replace a progress file atomically, so that a reader never sees it half written."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def train(args: argparse.Namespace) -> None:
    """Deterministic small Transformer training; writes progress and a hash of the weights."""
    import torch

    torch.manual_seed(0)
    device = "cuda"
    ballast = None
    if args.ballast_gib:
        ballast = torch.ones(int(args.ballast_gib * (1 << 30)) // 4, device=device)
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, 4).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device=device)
    progress = Path(args.progress)
    write_progress(progress, "0")
    for step in range(args.steps):
        gen.manual_seed(step)
        x = torch.randn(8, 256, 512, device=device, generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 5 == 0:
            loss.item()
            write_progress(progress, str(step))
    torch.cuda.synchronize()
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().float().cpu().numpy().tobytes())
    if ballast is not None:
        digest.update(str(float(ballast.sum().item())).encode())
    Path(args.result).write_text(digest.hexdigest())
    write_progress(progress, str(args.steps))


def cupy_loop(args: argparse.Namespace) -> None:
    """A CUDA program without PyTorch: matrix products in a loop, progress to a file."""
    import cupy as cp

    a = cp.random.rand(4096, 4096, dtype=cp.float32)
    progress = Path(args.progress)
    i = 0
    deadline = time.time() + args.seconds
    while time.time() < deadline:
        a = a @ a
        a /= cp.linalg.norm(a)
        cp.cuda.runtime.deviceSynchronize()
        i += 1
        write_progress(progress, str(i))


def mixed_loop(args: argparse.Namespace) -> None:
    """PyTorch loaded (so `gpreempt run` installs its gate) but the GPU work launched by CuPy,
    which the gate cannot see."""
    import torch

    torch.zeros(1, device="cuda")
    cupy_loop(args)


def hold_memory(args: argparse.Namespace) -> None:
    """Hold a GPU buffer of a given size until killed (a footprint to evict)."""
    import torch

    buf = torch.ones(int(args.gib * (1 << 30)) // 4, device="cuda")
    torch.cuda.synchronize()
    write_progress(Path(args.progress), "ready")
    while True:
        time.sleep(1)
        del_me = buf  # keep it alive
        del del_me


def need_memory(args: argparse.Namespace) -> None:
    """High-priority work that needs more memory than is free: waits for room inside request()."""
    import torch

    import gpreempt

    torch.cuda.init()
    need = int(args.gib * (1 << 30))
    report = {"need_bytes": need}
    with gpreempt.request():
        start = time.perf_counter()
        free0, _ = torch.cuda.mem_get_info()
        report["free_at_request"] = free0
        while torch.cuda.mem_get_info()[0] < need + (1 << 30):
            if time.perf_counter() - start > 30:
                report["error"] = "no room after 30 s"
                Path(args.result).write_text(json.dumps(report))
                sys.exit(1)
            time.sleep(0.01)
        report["waited_s"] = time.perf_counter() - start
        buf = torch.empty(need // 2, dtype=torch.float16, device="cuda")
        buf.fill_(1.0)
        report["sum"] = float(buf[:1000].float().sum().item())
        torch.cuda.synchronize()
        del buf
        torch.cuda.empty_cache()
    report["ok"] = True
    Path(args.result).write_text(json.dumps(report))


# ---------------------------------------------------------------------- orchestration
def env_for(rt: Path) -> dict[str, str]:
    env = os.environ.copy()
    env["GPREEMPT_RUNTIME_DIR"] = str(rt)
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def cli(rt: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "gpreempt", *args], env=env_for(rt), capture_output=True, text=True
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"gpreempt {' '.join(args)} failed: {result.stderr}")
    return result


def gp_run(rt: Path, *options: str) -> list[str]:
    """``gpreempt run --runtime-dir RT OPTIONS --``: put the command after it."""
    return [sys.executable, "-m", "gpreempt", "run", "--runtime-dir", str(rt), *options, "--"]


def me(*args: str) -> list[str]:
    return [sys.executable, str(HERE), *args]


def wait_file(path: Path, predicate=lambda text: bool(text), timeout: float = 120) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            text = path.read_text()
            if predicate(text):
                return text
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{path} not ready after {timeout} s")


def progress_of(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (ValueError, FileNotFoundError):
        return 0


def start_daemon(rt: Path, *options: str) -> subprocess.Popen:
    rt.mkdir(parents=True, exist_ok=True)
    os.chmod(rt, 0o700)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpreempt", "serve", "--runtime-dir", str(rt), *options],
        env=env_for(rt),
        stderr=open(rt / "serve.log", "w"),  # noqa: SIM115
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        if cli(rt, "status", "--json", check=False).returncode == 0:
            return proc
        time.sleep(0.1)
    raise RuntimeError("daemon did not start")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def hammer(rt: Path, target: str, progress: Path, times: int, hold_s: float) -> dict:
    """Suspend and resume a task by hand ``times`` times; check it stalls while suspended."""
    import gpreempt
    from gpreempt.mechanisms.cuda_driver import CheckpointDriver

    driver = CheckpointDriver.get()
    stalls, moved, latencies = 0, 0, []
    pid = None
    for i in range(times):
        start = time.perf_counter()
        task = gpreempt.suspend(target, runtime_dir=rt)
        latencies.append((time.perf_counter() - start) * 1e3)
        pid = task["pid"]
        state = driver.state(pid).name
        if i % 10 == 0:  # a longer look: progress must not move while locked
            before = progress_of(progress)
            time.sleep(0.3)
            after = progress_of(progress)
            stalls += 1
            moved += after != before
            assert state == "LOCKED", state
        else:
            time.sleep(hold_s)
        gpreempt.resume(target, runtime_dir=rt)
        time.sleep(hold_s)
    status = next(t for t in gpreempt.status(rt)["tasks"] if t["pid"] == pid)
    return {
        "suspensions": times,
        "stall_checks": stalls,
        "progress_moved_while_locked": moved,
        "suspend_call_ms_p50": sorted(latencies)[len(latencies) // 2],
        "suspend_call_ms_max": max(latencies),
        "status_preemptions": status["preemptions"],
        "status_last_suspend_ms": status["last_suspend_ms"],
    }


def undisturbed(out: Path, tag: str, steps: int, ballast: float = 0.0) -> str:
    result = out / f"hash-{tag}.txt"
    subprocess.run(
        me(
            "train",
            "--steps",
            str(steps),
            "--progress",
            str(out / f"p-{tag}"),
            "--result",
            str(result),
            "--ballast-gib",
            str(ballast),
        ),
        check=True,
        env=env_for(out / "none"),
    )
    return result.read_text()


def check_lock_run(out: Path, steps: int) -> dict:
    rt = out / "rt-run"
    daemon = start_daemon(rt)
    try:
        progress, result = out / "p-run", out / "hash-run.txt"
        proc = subprocess.Popen(
            gp_run(rt, "--priority", "low", "--mechanism", "lock", "--name", "trainer")
            + me(
                "train", "--steps", str(steps), "--progress", str(progress), "--result", str(result)
            ),
            env=env_for(rt),
        )
        wait_file(progress, lambda t: t.isdigit() and int(t) >= 10)
        report = hammer(rt, "trainer", progress, 120, 0.005)
        report["exit_code"] = proc.wait(600)
        report["hash"] = result.read_text()
        return report
    finally:
        stop(daemon)


def check_lock_attach(out: Path, steps: int) -> dict:
    rt = out / "rt-attach"
    daemon = start_daemon(rt)
    report: dict = {}
    try:
        progress, result = out / "p-attach", out / "hash-attach.txt"
        proc = subprocess.Popen(
            me(
                "train", "--steps", str(steps), "--progress", str(progress), "--result", str(result)
            ),
            env=env_for(out / "none"),
            start_new_session=True,
        )
        wait_file(progress, lambda t: t.isdigit() and int(t) >= 10)
        cli(
            rt,
            "attach",
            "--pid",
            str(proc.pid),
            "--priority",
            "low",
            "--mechanism",
            "lock",
            "--name",
            "attached-trainer",
        )
        report["torch"] = hammer(rt, "attached-trainer", progress, 100, 0.005)
        report["torch"]["exit_code"] = proc.wait(600)
        report["torch"]["hash"] = result.read_text()

        cprog = out / "p-cupy"
        cupy = subprocess.Popen(
            me("cupy", "--progress", str(cprog), "--seconds", "60"), start_new_session=True
        )
        try:
            wait_file(cprog, lambda t: t.isdigit() and int(t) >= 3)
            cli(
                rt,
                "attach",
                "--pid",
                str(cupy.pid),
                "--priority",
                "low",
                "--mechanism",
                "lock",
                "--name",
                "cupy-loop",
            )
            report["cupy"] = hammer(rt, "cupy-loop", cprog, 20, 0.02)
            before = progress_of(cprog)
            time.sleep(0.5)
            report["cupy"]["progress_after_release"] = progress_of(cprog) - before
        finally:
            cupy.kill()
            cupy.wait()
        report["status"] = json.loads(cli(rt, "status", "--json").stdout)
        return report
    finally:
        stop(daemon)


def check_lock_run_cupy(out: Path) -> dict:
    """The lock on a CUDA program that is not PyTorch, started with ``gpreempt run``."""
    rt = out / "rt-run-cupy"
    daemon = start_daemon(rt)
    try:
        progress = out / "p-run-cupy"
        proc = subprocess.Popen(
            gp_run(rt, "--priority", "low", "--mechanism", "lock", "--name", "cupy-run")
            + me("cupy", "--progress", str(progress), "--seconds", "60"),
            env=env_for(rt),
        )
        try:
            wait_file(progress, lambda t: t.isdigit() and int(t) >= 3)
            report = hammer(rt, "cupy-run", progress, 20, 0.02)
            before = progress_of(progress)
            time.sleep(0.5)
            report["progress_after_release"] = progress_of(progress) - before
        finally:
            proc.send_signal(signal.SIGTERM)  # the launcher forwards it to the loop
            report_exit = proc.wait(30)
        report["launcher_exit_code"] = report_exit
        return report
    finally:
        stop(daemon)


def check_backstop(out: Path) -> dict:
    """Mechanism auto on a process whose GPU work its gate cannot see (CuPy kernels in a
    PyTorch process): with the backstop the driver lock stops it; without, it runs on."""
    import gpreempt
    from gpreempt.mechanisms.cuda_driver import CheckpointDriver

    driver = CheckpointDriver.get()
    report: dict = {}
    for label, options in (("backstop", ()), ("gate_only", ("--backstop-ms", "0"))):
        rt = out / f"rt-backstop-{label}"
        daemon = start_daemon(rt, *options)
        progress = out / f"p-mixed-{label}"
        proc = subprocess.Popen(
            gp_run(rt, "--priority", "low", "--mechanism", "auto", "--name", "mixed")
            + me("mixed", "--progress", str(progress), "--seconds", "60"),
            env=env_for(rt),
        )
        trials = []
        try:
            wait_file(progress, lambda t: t.isdigit() and int(t) >= 3)
            for _ in range(5):
                task = gpreempt.suspend("mixed", runtime_dir=rt)
                time.sleep(0.15)  # the backstop locks after 50 ms by default
                before = progress_of(progress)
                time.sleep(0.3)
                after = progress_of(progress)
                status = next(t for t in gpreempt.status(rt)["tasks"] if t["name"] == "mixed")
                trials.append(
                    {
                        "mechanism": status["last_mechanism"],
                        "backstop_locked": status["backstop_locked"],
                        "driver_state": driver.state(task["pid"]).name,
                        "moved_while_suspended": after - before,
                    }
                )
                gpreempt.resume("mixed", runtime_dir=rt)
                time.sleep(0.2)
            before = progress_of(progress)
            time.sleep(0.5)
            report[label] = {
                "trials": trials,
                "progress_after_release": progress_of(progress) - before,
                "driver_state_after_release": driver.state(task["pid"]).name,
            }
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            stop(daemon)
    return report


def check_memory(out: Path, steps: int, ballast: float, need: float) -> dict:
    rt = out / "rt-mem"
    daemon = start_daemon(rt)
    try:
        progress, result = out / "p-mem", out / "hash-mem.txt"
        trainer = subprocess.Popen(
            gp_run(rt, "--priority", "low", "--name", "trainer")
            + me(
                "train",
                "--steps",
                str(steps),
                "--progress",
                str(progress),
                "--result",
                str(result),
                "--ballast-gib",
                str(ballast),
            ),
            env=env_for(rt),
        )
        wait_file(progress, lambda t: t.isdigit() and int(t) >= 10)
        hi_result = out / "need.json"
        high = subprocess.run(
            gp_run(
                rt, "--priority", "high", "--reserve-memory", f"{need + 2}GiB", "--name", "server"
            )
            + me("need", "--gib", str(need), "--result", str(hi_result)),
            env=env_for(rt),
            capture_output=True,
            text=True,
            timeout=300,
        )
        report = {"high_exit_code": high.returncode, "high": json.loads(hi_result.read_text())}
        report["trainer_exit_code"] = trainer.wait(600)
        report["hash"] = result.read_text()
        events = [json.loads(x) for x in (rt / "events.jsonl").read_text().splitlines()]
        report["events"] = [e for e in events if e["event"] in ("evict", "restore", "error")]
        return report
    finally:
        stop(daemon)


def check_rates(out: Path, sizes: list[float]) -> dict:
    import torch

    rates: dict = {"evict": [], "copy": {}}
    n = int(4 * (1 << 30))
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    for label, pinned in (("pinned", True), ("pageable", False)):
        host = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
        for direction in ("d2h", "h2d"):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(3):
                if direction == "d2h":
                    host.copy_(dev, non_blocking=pinned)
                else:
                    dev.copy_(host, non_blocking=pinned)
            torch.cuda.synchronize()
            rates["copy"][f"{direction}_{label}_gb_s"] = 3 * n / (time.perf_counter() - start) / 1e9
        del host
    del dev
    torch.cuda.empty_cache()
    rt = out / "rt-rates"
    daemon = start_daemon(rt)
    try:
        import gpreempt

        for gib in sizes:
            progress = out / f"p-hold-{gib}"
            proc = subprocess.Popen(
                me("hold", "--gib", str(gib), "--progress", str(progress)), start_new_session=True
            )
            try:
                wait_file(progress, lambda t: t == "ready")
                name = f"hold-{gib}"
                cli(rt, "attach", "--pid", str(proc.pid), "--mechanism", "lock", "--name", name)
                gpreempt.evict(name, runtime_dir=rt)
                gpreempt.restore(name, runtime_dir=rt)
            finally:
                proc.kill()
                proc.wait()
        events = [json.loads(x) for x in (rt / "events.jsonl").read_text().splitlines()]
        for e in events:
            if e["event"] in ("evict", "restore"):
                rates["evict"].append(
                    {k: e.get(k) for k in ("event", "task", "bytes", "latency_ms", "gb_per_s")}
                )
        return rates
    finally:
        stop(daemon)


def run_all(args: argparse.Namespace) -> None:
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    free, total = torch.cuda.mem_get_info()
    gib = 1 << 30
    # The trainer holds 30 GiB more than its model; the high-priority job then needs more than
    # what is left free, so it can only run if the trainer's memory moves to the host.
    ballast = 30.0
    need = round(free / gib - 20.0, 1)
    mem_steps = args.steps * 5
    results: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "free_gib_at_start": free / gib,
        "params": {
            "steps": args.steps,
            "memory_steps": mem_steps,
            "ballast_gib": ballast,
            "need_gib": need,
        },
    }
    sections = [
        (
            "undisturbed",
            lambda: {
                "hash_a": undisturbed(out, "a", args.steps),
                "hash_b": undisturbed(out, "b", args.steps),
                "hash_ballast": undisturbed(out, "ballast", mem_steps, ballast),
            },
        ),
        ("lock_run", lambda: check_lock_run(out, args.steps)),
        ("lock_attach", lambda: check_lock_attach(out, args.steps)),
        ("lock_run_cupy", lambda: check_lock_run_cupy(out)),
        ("backstop", lambda: check_backstop(out)),
        ("memory", lambda: check_memory(out, mem_steps, ballast, need)),
        ("rates", lambda: check_rates(out, [1.0, 4.0, 16.0])),
    ]
    wanted = set(args.sections.split(",")) if args.sections else None
    for name, fn in sections:
        if wanted is not None and name not in wanted:
            continue
        start = time.time()
        try:
            results[name] = fn()
        except Exception as exc:  # keep going: report every section
            results[name] = {"error": repr(exc)}
        results[name]["seconds"] = round(time.time() - start, 1)
        (out / "validate.json").write_text(json.dumps(results, indent=1, default=str))
        print(f"[{name}] done in {results[name]['seconds']} s", flush=True)
    summarize(results)


def summarize(r: dict) -> None:
    """Print one line per check of the sections that ran."""
    u = r.get("undisturbed", {})
    ref = u.get("hash_a")
    rows: list[tuple[str, object]] = []
    if "undisturbed" in r:
        rows.append(("determinism control (two undisturbed runs equal)", ref == u.get("hash_b")))
    if "lock_run" in r:
        lr = r["lock_run"]
        rows += [
            ("run+lock: suspensions", lr.get("status_preemptions")),
            (
                "run+lock: progress moved while locked (of checks)",
                f"{lr.get('progress_moved_while_locked')}/{lr.get('stall_checks')}",
            ),
            ("run+lock: suspend call p50 ms", lr.get("suspend_call_ms_p50")),
            ("run+lock: weights bit-identical", ref is not None and lr.get("hash") == ref),
        ]
    if "lock_attach" in r:
        t, c = r["lock_attach"].get("torch", {}), r["lock_attach"].get("cupy", {})
        rows += [
            ("attach+lock torch: suspensions", t.get("status_preemptions")),
            ("attach+lock torch: moved while locked", f"{t.get('progress_moved_while_locked')}"),
            ("attach+lock torch: weights bit-identical", ref is not None and t.get("hash") == ref),
            ("attach+lock cupy: moved while locked", f"{c.get('progress_moved_while_locked')}"),
            ("attach+lock cupy: iterations 0.5 s after release", c.get("progress_after_release")),
        ]
    if "lock_run_cupy" in r:
        rc = r["lock_run_cupy"]
        rows += [
            ("run+lock cupy: suspensions", rc.get("status_preemptions")),
            (
                "run+lock cupy: moved while locked (of checks)",
                f"{rc.get('progress_moved_while_locked')}/{rc.get('stall_checks')}",
            ),
            ("run+lock cupy: iterations 0.5 s after release", rc.get("progress_after_release")),
        ]
    for label in ("backstop", "gate_only"):
        b = r.get("backstop", {}).get(label)
        if b:
            moved = [t["moved_while_suspended"] for t in b["trials"]]
            rows += [
                (f"auto, {label}: iterations while suspended (5 holds)", moved),
                (f"auto, {label}: driver locked", [t["backstop_locked"] for t in b["trials"]]),
                (f"auto, {label}: iterations 0.5 s after release", b["progress_after_release"]),
            ]
    if "memory" in r:
        m = r["memory"]
        events = m.get("events", [])
        ballast = u.get("hash_ballast")
        rows += [
            ("memory: high-priority exit code", m.get("high_exit_code")),
            (
                "memory: evictions/restores",
                f"{sum(e['event'] == 'evict' for e in events)}"
                f"/{sum(e['event'] == 'restore' for e in events)}",
            ),
            (
                "memory: trainer weights bit-identical",
                ballast is not None and m.get("hash") == ballast,
            ),
        ]
    for e in r.get("rates", {}).get("evict", []):
        rows.append((f"{e['event']} {e['bytes'] / 2**30:.1f} GiB: GB/s", e["gb_per_s"]))
    for k, v in r.get("rates", {}).get("copy", {}).items():
        rows.append((f"copy {k}", round(v, 1)))
    for name in ("lock_run", "lock_attach", "lock_run_cupy", "backstop", "memory", "rates"):
        if "error" in r.get(name, {}):
            rows.append((f"{name} ERROR", r[name]["error"][:200]))
    width = max((len(k) for k, _ in rows), default=0)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("train")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--progress", required=True)
    p.add_argument("--result", required=True)
    p.add_argument("--ballast-gib", type=float, default=0.0)
    p.set_defaults(fn=train)
    p = sub.add_parser("cupy")
    p.add_argument("--progress", required=True)
    p.add_argument("--seconds", type=float, default=60)
    p.set_defaults(fn=cupy_loop)
    p = sub.add_parser("mixed")
    p.add_argument("--progress", required=True)
    p.add_argument("--seconds", type=float, default=60)
    p.set_defaults(fn=mixed_loop)
    p = sub.add_parser("hold")
    p.add_argument("--gib", type=float, required=True)
    p.add_argument("--progress", required=True)
    p.set_defaults(fn=hold_memory)
    p = sub.add_parser("need")
    p.add_argument("--gib", type=float, required=True)
    p.add_argument("--result", required=True)
    p.set_defaults(fn=need_memory)
    p = sub.add_parser("all")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument(
        "--sections",
        help="comma-separated sections to run (undisturbed, lock_run, lock_attach, "
        "lock_run_cupy, backstop, memory, rates; default: all)",
    )
    p.set_defaults(fn=run_all)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
