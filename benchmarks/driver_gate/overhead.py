"""What the defaults cost a trainer that nobody preempts, for trainers of every framework.

For each trainer kind a copy of it per configuration runs beside the others, taking turns on
the GPU (one runs while the others wait idle), in rounds whose order is shuffled:

* ``ungated``: plain ``python``, no gpreempt at all;
* ``control``: a second copy without gpreempt, given only what ``gpreempt run`` sets for the
  frameworks of a task below ``high`` (XLA's graphs off: ``client/framework_settings.py``;
  nothing for the other kinds): its ratio would be 1 but for those settings, what tells the
  processes apart beside gpreempt (where their memory lies) and the rounds' noise; read the
  others against its spread. The copies start in an order shuffled per kind (each turn
  records its copy's place, ``started``, and its place in its round, ``place``, behind the
  configuration ``after``), each in a session of its own;
* ``defaults``: ``gpreempt run --priority low`` beside an idle, more important task registered
  on the same GPU (``gpreempt run --priority high -- sleep``): the daemon lets its gate sleep
  after a second;
* ``awake``: the same under a daemon that never lets a gate sleep (``--sleep-after-s 0``): its
  gates stay awake and put their stream barriers, as beside a server that is busy but not
  running at this instant;
* ``awake:NAME=VALUE`` (``--awake-variant NAME=VALUE``, repeatable): ``awake`` with that
  variable set for the trainer, to tell which part of the gate costs what (for example
  ``GPREEMPT_DRIVER_GATE=0``: the operator gate alone).

Each turn runs training steps for ``--turn-s`` seconds, then waits for the GPU to finish what
they queued; the ratio of a configuration is its steps per second over ``ungated``'s in the
same round. After each turn of a gated copy its daemon is asked for the driver-level gate's
counters: each turn records the launches its callbacks saw and the stream barriers it put
(``gate``), so the table tells how much of a turn an asleep gate spent awake (a gate whose
process queues far ahead wakes while the GPU work between its thread's barriers is long), and
the launches that waited for the work in flight to fall within the window (``bound_waits``).
Each turn also records what tells a trainer bound by its CPU from one bound by its GPU: the
wait for its queued work after the loop (``drain_s``: about nothing where the GPU keeps up with
the CPU) and the main thread's CPU time over the loop's wall time (``loop_cpu``).

    PYTHONPATH=src python3 benchmarks/driver_gate/overhead.py --out overhead.json

Prints a table (median ratio and the spread of the rounds) and writes every turn to ``--out``;
``--table overhead.json`` prints the table of a file written so.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpreempt.bench import turns
from gpreempt.client.connection import DaemonClient
from gpreempt.client.framework_settings import framework_settings
from gpreempt.errors import GpreemptError
from gpreempt.priority import NAMED

CONFIGS = ("ungated", "control", "defaults", "awake")
PLAIN = ("ungated", "control")  # the copies without gpreempt
KINDS = ("transformer-sync", "transformer-compiled", "jax", "cupy")

CHILD = r"""
import sys, time
from pathlib import Path
kind, turn_path, me, out_path = sys.argv[1:5]
from gpreempt.bench import builtin_workloads as w, turns
if kind in ("cupy", "cupy-torch"):
    step = w.cupy_trainer(with_torch=kind == "cupy-torch")
elif kind in ("jax", "jax-torch"):
    step = w.jax_trainer(with_torch=kind == "jax-torch")
else:
    step = w.transformer_trainer(sync_loss=kind == "transformer-sync",
                                 compiled=kind == "transformer-compiled")

def drain(token):
    if token is not None and hasattr(token, "synchronize"):
        token.synchronize()
    elif token is not None and hasattr(token, "block_until_ready"):
        token.block_until_ready()

token = None
for _ in range(15):
    token = step()
drain(token)

def run(key):
    global token
    seconds = float(key.split(":")[1])
    start, cpu = time.perf_counter(), time.thread_time()
    steps = 0
    while time.perf_counter() - start < seconds:
        token = step()
        steps += 1
    loop_s, loop_cpu_s = time.perf_counter() - start, time.thread_time() - cpu
    drain(token)
    s = time.perf_counter() - start
    return {"steps": steps, "s": s, "drain_s": s - loop_s, "loop_cpu": loop_cpu_s / loop_s}

turns.take_turns(Path(turn_path), me, Path(out_path), run)
"""


def plain_env(config: str, env: dict[str, str]) -> dict[str, str]:
    """The environment of a copy without gpreempt: ``control`` gets what ``gpreempt run`` sets
    for the frameworks of a task below ``high``, ``ungated`` nothing."""
    if config == "control":
        return {**env, **framework_settings(env, NAMED["low"])}
    return env


def gate_counts(runtime: Path) -> dict | None:
    """The driver-level gate counters of the copy named ``trainer`` under the daemon of
    ``runtime``, or None where it cannot be asked."""
    try:
        with DaemonClient.connect(runtime, timeout=2) as client:
            tasks = client.status()["tasks"]
        gate = next(t for t in tasks if t["name"] == "trainer")["gate"]
        return {
            "launches": gate["driver_launches"],
            "barriers": gate["driver_barriers"],
            "bound_waits": gate["driver_bound_waits"],
        }
    except (GpreemptError, OSError, KeyError, TypeError, StopIteration):
        return None  # a figure missing (no daemon, no such task, no gate), never a run lost


def counted(before: dict | None, after: dict | None) -> dict | None:
    """What the gate counted between two snapshots of :func:`gate_counts`."""
    if before is None or after is None:
        return None
    return {key: after[key] - before[key] for key in after}


def measure_kind(
    kind: str, rounds: int, turn_s: float, work: Path, variants: tuple[str, ...] = ()
) -> list[dict]:
    """Every turn of ``kind`` under each configuration, interleaved."""
    env = {**turns.clean_env(), "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    procs: list[subprocess.Popen] = []
    turn = work / f"{kind}.turn"
    turn.write_text("")
    configs = (*CONFIGS, *(f"awake:{v}" for v in variants))
    ids = {c: f"c{i}" for i, c in enumerate(configs)}  # turn words name no variable
    outs = {c: work / f"{kind}.{ids[c]}.jsonl" for c in configs}
    runtimes = {c: work / f"rt-{kind}-{ids[c]}" for c in configs if c not in PLAIN}

    def child(config: str) -> list[str]:
        return [sys.executable, "-c", CHILD, kind, str(turn), ids[config], str(outs[config])]

    def start(config: str) -> None:
        """One copy; each in a session of its own, as ``gpreempt run`` starts its command."""
        if config in PLAIN:
            procs.append(
                subprocess.Popen(child(config), env=plain_env(config, env), start_new_session=True)
            )
            return
        runtime = runtimes[config]
        sleep_after = [] if config == "defaults" else ["--sleep-after-s", "0"]
        procs.append(turns.start_daemon(runtime, env, sleep_after))
        run = turns.run_under(runtime)
        procs.append(
            subprocess.Popen([*run, "--priority", "high", "--", "sleep", "100000"], env=env)
        )
        name, _, value = config.partition(":")[2].partition("=")
        child_env = {**env, name: value} if name else env
        low = [*run, "--priority", "low", "--name", "trainer", "--", *child(config)]
        procs.append(subprocess.Popen(low, env=child_env))

    # the copies start in an order shuffled per kind, so that what favours a place in it
    # (their memory's place, their start) falls on no configuration in particular
    started = random.sample(configs, len(configs))
    try:
        for config in started:
            start(config)
        turns.wait_started(list(outs.values()), procs)
        time.sleep(2.0)  # the defaults' gate falls asleep beside its idle server
        orders: list[list[str]] = []
        last = {c: gate_counts(r) for c, r in runtimes.items()}
        gates: dict[tuple[str, str], dict | None] = {}
        for r in range(rounds):
            order = list(configs)
            random.shuffle(order)
            orders.append(order)
            for config in order:
                key = f"{r}:{turn_s}"
                turns.give_turn(turn, ids[config], key, outs[config], turn_s * 10 + 60)
                if config in runtimes:
                    now = gate_counts(runtimes[config])
                    gates[(config, key)] = counted(last[config], now)
                    last[config] = now
            print(f"  {kind} round {r + 1}/{rounds}", file=sys.stderr, flush=True)
        return placed(
            [
                {
                    "kind": kind,
                    "config": config,
                    "started": started.index(config),
                    **x,
                    **({"gate": gates.get((config, x["turn"]))} if config in runtimes else {}),
                }
                for config in configs
                for x in turns.read_lines(outs[config])
            ],
            orders,
        )
    finally:
        turns.stop_all(turn, procs)


def placed(records: list[dict], orders: list[list[str]]) -> list[dict]:
    """``records`` with each turn's ``place`` in its round's order and the configuration that
    ran just ``after`` which ("" for the first): what a copy leaves on the GPU, or does while
    it waits, may fall on the copy that follows it."""
    out = []
    for record in records:
        order = orders[int(str(record["turn"]).split(":")[0])]
        place = order.index(record["config"])
        out.append({**record, "place": place, "after": order[place - 1] if place else ""})
    return out


def ratios(turns: list[dict], kind: str, config: str, base: str = "ungated") -> list[float]:
    """Per round: steps per second of ``config`` over ``base``'s."""
    rate = {(t["config"], t["turn"]): t["steps"] / t["s"] for t in turns if t["kind"] == kind}
    return [
        rate[(config, key)] / rate[(base, key)]
        for (c, key) in rate
        if c == config and (base, key) in rate
    ]


def against_awake(turns: list[dict], kind: str, variant: str) -> str:
    """``awake`` over an awake variant round by round (the rounds' drift cancels out of a pair
    measured in one round): the median, the spread and the rounds ``awake`` was ahead in."""
    r = ratios(turns, kind, "awake", base=variant)
    if not r:
        return ""
    ahead = sum(x > 1.0 for x in r)
    return (
        f"{'':32s} awake over it, round by round: {statistics.median(r):.3f} "
        f"[{min(r):.3f}-{max(r):.3f}], ahead in {ahead} of {len(r)}"
    )


def seen_per_step(turns: list[dict], kind: str, config: str) -> float | None:
    """The median over the turns of the launches the gate's callbacks saw per step (0 while
    asleep), or None where no turn has its counters."""
    seen = [
        t["gate"]["launches"] / t["steps"]
        for t in turns
        if t["kind"] == kind and t["config"] == config and t.get("gate") and t["steps"]
    ]
    return statistics.median(seen) if seen else None


def bound_by(turns: list[dict], kind: str, config: str) -> str:
    """The medians over the turns of ``drain_s`` (in ms) and ``loop_cpu``, where recorded."""
    mine = [t for t in turns if t["kind"] == kind and t["config"] == config and "drain_s" in t]
    if not mine:
        return ""
    drain = statistics.median(t["drain_s"] * 1e3 for t in mine)
    return f"   drain {drain:.1f} ms, cpu {statistics.median(t['loop_cpu'] for t in mine):.2f}"


def print_table(turns: list[dict], kinds: list[str], variants: tuple[str, ...]) -> None:
    """Each configuration's ratio of ``ungated``: the median and the spread of the rounds;
    for gated copies, the launches per step their callbacks saw (an asleep gate's share of
    its awake one's tells how long it was awake); where recorded, the queued work left at the
    end of a turn and the main thread's CPU share (:func:`bound_by`); under each awake
    variant, ``awake`` over it round by round (:func:`against_awake`)."""
    print(
        f"{'kind':22s} {'config':9s} ratio of ungated: median [min-max] over rounds"
        "   launches seen per step"
    )
    for kind in kinds:
        for config in (*CONFIGS, *(f"awake:{v}" for v in variants)):
            r = ratios(turns, kind, config)
            seen = seen_per_step(turns, kind, config)
            if r and config != "ungated":
                print(
                    f"{kind:22s} {config:9s} {statistics.median(r):.3f} "
                    f"[{min(r):.3f}-{max(r):.3f}] n={len(r)}"
                    + (f"   {seen:.1f}" if seen is not None else "")
                    + bound_by(turns, kind, config)
                )
            elif config == "ungated" and bound_by(turns, kind, config):
                print(f"{kind:22s} {config:9s} {'':24s}" + bound_by(turns, kind, config))
            if config.startswith("awake:") and against_awake(turns, kind, config):
                print(against_awake(turns, kind, config))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--turn-s", type=float, default=2.0)
    parser.add_argument("--out", help="where to write every turn (JSON)")
    parser.add_argument("--table", metavar="JSON", help="print the table of a file --out wrote")
    parser.add_argument(
        "--awake-variant",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="also measure awake with this variable set for the trainer (repeatable)",
    )
    args = parser.parse_args()
    if args.table:
        try:
            saved = json.loads(Path(args.table).read_text())
            kinds = list(dict.fromkeys(t["kind"] for t in saved["turns"]))
            print_table(saved["turns"], kinds, tuple(saved.get("variants", ())))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            parser.error(f"cannot read {args.table} as a file --out wrote: {exc}")
        return 0
    if not args.out:
        parser.error("--out is required (or --table to print a saved file)")
    variants = tuple(args.awake_variant)
    for v in variants:
        if "=" not in v or not v.split("=", 1)[0]:
            parser.error(f"--awake-variant wants NAME=VALUE, not {v!r}")
    turns: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="gpreempt-overhead-") as tmp:
        for kind in args.kinds.split(","):
            try:
                turns += measure_kind(kind, args.rounds, args.turn_s, Path(tmp), variants)
            except RuntimeError as exc:
                print(f"overhead: {exc}", file=sys.stderr)
            # written after each kind: a run cut short keeps the kinds it finished
            Path(args.out).write_text(
                json.dumps(
                    {
                        "rounds": args.rounds,
                        "turn_s": args.turn_s,
                        "variants": variants,
                        "turns": turns,
                    },
                    indent=1,
                )
            )
    print_table(turns, args.kinds.split(","), variants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
