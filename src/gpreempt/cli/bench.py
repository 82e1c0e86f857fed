"""``gpreempt bench``: the test plan, every alternative side by side, in one run."""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import textwrap
from pathlib import Path

from ..errors import MechanismUnavailable, UsageError
from ._bench_summary import print_summary

EPILOG = """\
scenarios (a-alone and b-alone are always measured, every ratio needs them):
  a-alone          Case-A alone (reference for the P99 ratio)
  b-alone          Case-B alone (reference for B kept)
  sequential       Case-A then Case-B, no sharing (from a-alone and b-alone)
  time-sliced      separate processes, default time slicing
  stream-priority  one process: Case-A on a high-priority stream, Case-B in
                   a thread
  mps              separate processes under a private MPS daemon
  mps-priority     MPS with CUDA_MPS_CLIENT_PRIORITY=1 for Case-B
  gpreempt         a private `gpreempt serve`; Case-B `gpreempt run
                   --priority low`, Case-A `gpreempt run --priority high`:
                   the defaults, nothing else set
  gpreempt-no-request
                   the same, but Case-A never calls gpreempt.request()
  gpreempt-signal, gpreempt-lock, gpreempt-gate
                   as gpreempt, Case-B forced to `--mechanism M`
  a-alone-after    Case-A alone again, last: how far its own latency drifted
                   during the run (measured whenever a scenario shares the GPU)

opt-in scenarios (not in the default list, so that --quick keeps to about 8
minutes; name them in --scenarios, or use --scenarios all):
  gpreempt-timeslice   `gpreempt serve --policy timeslice` (default slices:
                       80 ms high, 20 ms low)
  gpreempt-share       `gpreempt serve --policy share`; Case-B also
                       --min-share 0.2
  gpreempt-scheduler   one process, no daemon: gpreempt.GPUScheduler with
                       Case-B's steps as a low task and Case-A's requests as
                       a high task (request() per request)
  memory-pressure      Case-B holds a ballast so little memory is free;
                       Case-A (`gpreempt run --reserve-memory`) grows its
                       working set beyond it mid-window; the daemon evicts
                       Case-B to the host and restores it after
  memory-pressure-baseline
                       the same without gpreempt: Case-A's growth runs out
                       of memory

outputs (in the run's directory): results.json, report.md,
latency_cdf.png/.json, timeline.png/.json, and runs/r<k>/<scenario>/ with
every process's log and raw data; with several --case-b kinds, each kind's
in a directory of its own, and Case-A's runs alone in runs/.

examples:
  gpreempt bench --quick
  gpreempt bench --bg 3 --case-a heavy --repeats 3 --out runs/heavy-3
  gpreempt bench --scenarios gpreempt,gpreempt-no-request \\
      --case-b transformer-sync
  gpreempt bench --scenarios gpreempt,gpreempt-lock --case-b cupy
  gpreempt bench --scenarios gpreempt,gpreempt-no-request --repeats 3 \\
      --case-b transformer-sync,transformer-compiled,jax-torch --out runs/three
  gpreempt bench --scenarios time-sliced,gpreempt --case-b-cmd "python t.py"
  gpreempt bench --quick \\
      --scenarios gpreempt-timeslice,gpreempt-share,gpreempt-scheduler
  gpreempt bench --quick --growth-gib 40 \\
      --scenarios memory-pressure,memory-pressure-baseline
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..bench.builtin_workloads import CASE_B_KINDS

    parser = subparsers.add_parser(
        "bench",
        help="measure Case-A latency and Case-B throughput under every alternative",
        description=textwrap.fill(
            "Run Case-A (latency-critical inference, high priority) beside Case-B (best-effort "
            "training, low priority) on GPU 0 under every way of sharing a GPU, on the same "
            "open-loop Poisson arrivals, and report Case-A's latency (P99 ratio against "
            "Case-A alone), Case-B's throughput kept, preemption latency and GPU utilisation.",
            width=78,
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--load",
        type=float,
        default=0.5,
        help="Case-A's offered load: requests arrive at load / S per second, S = Case-A's "
        "mean service time alone when served at that load, measured first (default 0.5)",
    )
    parser.add_argument(
        "--requests",
        type=int,
        help="Case-A requests per scenario (default 1000; 500 with --quick; P99 needs >= 1000)",
    )
    parser.add_argument(
        "--bg", type=int, default=1, help="number of Case-B processes, e.g. 1 or 3 (default 1)"
    )
    parser.add_argument(
        "--case-a",
        choices=("light", "heavy", "eager"),
        default="light",
        help="built-in Case-A: light = ResNet-50 fp16 batch 8 replayed from a CUDA graph, heavy "
        "= batch 64, eager = batch 8 without a graph (default light)",
    )
    parser.add_argument(
        "--case-b",
        metavar="KIND[,KIND...]",
        default="transformer",
        help=f"built-in Case-B, one of {', '.join(CASE_B_KINDS)}: transformer is an eager "
        "Transformer encoder training loop; -sync reads its loss "
        "every step (loss.item()), -compiled runs it under torch.compile; cupy is a CuPy GEMM "
        "loop with no PyTorch (default transformer). Several, comma-separated, share one run: "
        "Case-A is calibrated and measured alone once per repeat for all of them, and each "
        "gets a directory of its own in --out, named after it. KIND+NAME=VALUE[+...] sets "
        "variables for that trainer alone, to compare settings side by side, e.g. "
        "transformer-sync,transformer-sync+GPREEMPT_DRIVER_GATE=0",
    )
    parser.add_argument(
        "--case-a-fn",
        metavar="MODULE:FACTORY",
        help="your own Case-A: FACTORY() returns a callable that serves one request and returns "
        "when its answer is ready (replaces the built-in ResNet-50)",
    )
    parser.add_argument(
        "--case-b-fn",
        metavar="MODULE:FACTORY",
        help="your own Case-B: FACTORY() returns a callable that runs one training step and "
        "returns None or an object with synchronize() (e.g. a torch.cuda.Event)",
    )
    parser.add_argument(
        "--case-b-cmd",
        metavar="CMD",
        help="any command as Case-B. It may touch $GPREEMPT_BENCH_READY_FILE once warmed up "
        "(else it counts as ready after 3x --warmup-s), append one unix time per step to "
        "$GPREEMPT_BENCH_STEPS_FILE (else B kept is n/a), and must stop on SIGTERM",
    )
    for side in ("a", "b"):
        parser.add_argument(
            f"--env-{side}",
            metavar="NAME=VALUE",
            action="append",
            default=[],
            help=f"set NAME=VALUE in Case-{side.upper()}'s environment only (repeatable); e.g. "
            "GPREEMPT_DRIVER_GATE=0 to run one side without the driver-level gate",
        )
    parser.add_argument(
        "--scenarios",
        metavar="LIST",
        help="comma-separated scenarios to run, or `all` (default: every scenario except the "
        "opt-in ones; see below)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run every scenario N times and report the median and spread (3 recommended)",
    )
    parser.add_argument("--seed", type=int, default=0, help="arrival sequence seed (default 0)")
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="directory for this run (must be new or empty; default ./gpreempt-bench-<time>)",
    )
    parser.add_argument(
        "--warmup-s",
        type=float,
        help="each process warms up at least this long before the window (default 2; 1 quick)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short run: 500 requests, shorter warm-ups (made to finish within 8 minutes)",
    )
    parser.add_argument(
        "--no-nvml", action="store_true", help="do not sample GPU utilisation with NVML"
    )
    parser.add_argument(
        "--no-load-check",
        action="store_true",
        help="keep the calibration's arrival rate: do not serve the arrivals alone once first "
        "and correct the rate where Case-A's busy share lies off --load",
    )
    memory = parser.add_argument_group(
        "memory-pressure scenarios (F: GPU 0's free memory before the scenarios)"
    )
    memory.add_argument(
        "--ballast-gib",
        type=float,
        metavar="GIB",
        help="GPU memory Case-B holds beside its model (default F/2)",
    )
    memory.add_argument(
        "--growth-gib",
        type=float,
        metavar="GIB",
        help="how much Case-A's working set grows, more than is left free (default F/2)",
    )
    memory.add_argument(
        "--reserve-gib",
        type=float,
        metavar="GIB",
        help="Case-A's --reserve-memory: the headroom below which the daemon evicts (default 2)",
    )
    memory.add_argument(
        "--growth-at-s",
        type=float,
        metavar="S",
        help="grow at the first request due S seconds into Case-A's window (default: a third "
        "of the way)",
    )
    parser.add_argument(
        "--serve-args",
        metavar="ARGS",
        default="",
        help="options for the scenarios' private `gpreempt serve`, in one string, e.g. "
        '"--inflight-budget-ms 1.5"; a single option needs the = form, --serve-args=--no-watch '
        "(see `gpreempt serve --help`)",
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="Python interpreter for the workloads (default: this one)",
    )
    parser.set_defaults(func=run)


def _serve_args(value: str) -> tuple[str, ...]:
    try:
        words = tuple(shlex.split(value))
    except ValueError as exc:
        raise UsageError(f"--serve-args {value!r} does not parse as shell words: {exc}") from None
    if any(
        word in ("--runtime-dir", "--policy") or word.startswith(("--runtime-dir=", "--policy="))
        for word in words
    ):
        raise UsageError(
            "--serve-args may not set --runtime-dir or --policy: each scenario sets them"
        )
    return words


def _out_dir(value: str | None) -> Path:
    if value is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        return Path(f"gpreempt-bench-{stamp}")
    path = Path(value)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UsageError(f"--out {path} is not a new or empty directory: each run needs its own")
    return path


def run(args: argparse.Namespace) -> int:
    from ..bench.builtin_workloads import CASE_A_BATCH
    from ..bench.device import gpu_present
    from ..bench.runner import BenchConfig, assignments, run_bench, trainer_spec
    from ..bench.scenario_catalog import ALL_SCENARIOS, DEFAULT_SCENARIOS, check_scenarios
    from ..bench.workload_argv import Workloads

    names = [s.strip() for s in (args.scenarios or "").split(",") if s.strip()]
    if names == ["all"]:
        scenarios = ALL_SCENARIOS
    elif args.scenarios is None:
        scenarios = DEFAULT_SCENARIOS
    else:
        scenarios = check_scenarios(names)
    if not scenarios:
        raise UsageError("--scenarios is empty: name at least one scenario")
    if args.case_b_fn and args.case_b_cmd:
        raise UsageError("give --case-b-fn or --case-b-cmd, not both")
    case_b_kinds = _case_b_kinds(args.case_b)
    if len(case_b_kinds) > 1 and (args.case_b_fn or args.case_b_cmd):
        raise UsageError(
            "several --case-b kinds share a run of built-in trainers only; run a "
            "--case-b-fn or --case-b-cmd trainer on its own"
        )
    if not gpu_present():  # after the options are checked: bad input is said first
        raise MechanismUnavailable(
            "no NVIDIA GPU found (`nvidia-smi -L` lists none): the benchmark measures GPU "
            "sharing and needs one; run it on a GPU machine (`gpreempt demo` runs anywhere)"
        )
    warmup = args.warmup_s if args.warmup_s is not None else (1.0 if args.quick else 2.0)
    requests = args.requests or (500 if args.quick else 1000)
    workloads = Workloads(
        python=args.python,
        case_a_batch=CASE_A_BATCH[args.case_a],
        case_a_graph=args.case_a != "eager",
        case_b_kind=trainer_spec(case_b_kinds[0])[0],
        case_a_fn=args.case_a_fn,
        case_b_fn=args.case_b_fn,
        case_b_cmd=args.case_b_cmd,
        warmup_s=warmup,
        warmup_steps=5 if args.quick else 10,
        env_a=assignments(args.env_a, "--env-a"),
        env_b=assignments(args.env_b, "--env-b"),
    )
    config = BenchConfig(
        out_dir=_out_dir(args.out),
        load=args.load,
        requests=requests,
        bg=args.bg,
        case_a="custom" if args.case_a_fn else args.case_a,
        scenarios=scenarios,
        repeats=args.repeats,
        seed=args.seed,
        quick=args.quick,
        calibrate_requests=100 if args.quick else 200,
        workloads=workloads,
        nvml=not args.no_nvml,
        check_load=not args.no_load_check,
        serve_args=_serve_args(args.serve_args),
        command=shlex.join(["gpreempt", *sys.argv[1:]]),
        ballast_gib=args.ballast_gib,
        growth_gib=args.growth_gib,
        reserve_gib=args.reserve_gib,
        growth_at_s=args.growth_at_s,
        case_b_kinds=case_b_kinds,
    )
    results = run_bench(config)
    if len(case_b_kinds) == 1:
        print_summary(results, config.out_dir)
        return 0
    for kind in case_b_kinds:
        folder = config.out_dir / kind
        print_summary(json.loads((folder / "results.json").read_text()), folder, kind)
    return 0


def _case_b_kinds(text: str) -> tuple[str, ...]:
    """``--case-b``'s entries, each checked: one line for a kind that does not exist or a
    setting that is not NAME=VALUE."""
    from ..bench.builtin_workloads import CASE_B_KINDS
    from ..bench.runner import trainer_spec

    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    if not kinds:
        raise UsageError(f"--case-b is empty: name one of {', '.join(CASE_B_KINDS)}")
    for spec in kinds:
        kind, _settings = trainer_spec(spec)
        if kind not in CASE_B_KINDS:
            raise UsageError(
                f"--case-b {kind!r} is not a built-in trainer: one of {', '.join(CASE_B_KINDS)}"
            )
    if len(set(kinds)) != len(kinds):
        raise UsageError(f"--case-b names a trainer twice: {text}")
    return kinds
