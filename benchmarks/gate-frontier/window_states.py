"""How Case-A's window divides between the server and the trainers, from a bench run.

From the daemon's event log (``active``/``idle`` of Case-A, ``suspend``/``resume`` of each
trainer): the share of the window during which Case-A was active, and, while it was not, how
many trainers the daemon let run; then each trainer's steps in the window and B kept's bound.

    python3 benchmarks/gate-frontier/window_states.py BENCH_OUT_DIR...
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path


def _load(path: Path) -> object:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return json.load(handle)


def _events(run: Path) -> list[dict]:
    path = next(iter(sorted(run.glob("events.jsonl*"))), None)
    if path is None:
        raise SystemExit(f"{run}: no events.jsonl: not a gpreempt scenario directory")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return [e for e in map(json.loads, handle) if "t" in e]


def states(run: Path) -> dict:
    """Shares of the window: ``a`` (Case-A active), ``none``/``one``/``multi`` trainers let run
    otherwise; plus the trainers' steps in the window."""
    found = sorted(run.glob("case-a.json*"))
    if not found:
        raise SystemExit(f"{run}: no case-a.json: not a gpreempt scenario of a bench run")
    served = _load(found[0])
    start, end = min(served["scheduled"]), max(served["end"])
    shares = {"a": 0.0, "none": 0.0, "one": 0.0, "multi": 0.0}
    running: dict[str, bool] = {}
    server_active = False
    last = None
    for event in _events(run):
        t = event["t"]
        if last is not None and start <= t <= end:
            free = sum(running.values())
            kind = "a" if server_active else ("none", "one")[free] if free < 2 else "multi"
            shares[kind] += t - max(last, start)
        if t >= start:
            last = t
        task = event.get("task") or ""
        if task == "case-a" and event["event"] in ("active", "idle"):
            server_active = event["event"] == "active"
        elif task.startswith("case-b") and event["event"] in ("registered", "resume", "suspend"):
            running[task] = event["event"] != "suspend"
    total = sum(shares.values()) or 1.0
    steps = []
    for path in sorted(run.glob("case-b-*.json")):
        times = _load(path)["step_end_t"]
        steps.append(sum(start <= t <= end for t in times))
    return {
        "window_s": end - start,
        "shares": {k: v / total for k, v in shares.items()},
        "steps": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="bench --out directories")
    args = parser.parse_args()
    for directory in args.dirs:
        run = directory / "runs" / "r0" / "gpreempt-gate"
        found = states(run)
        results = json.loads((directory / "results.json").read_text())["scenarios"]
        kept = results["gpreempt-gate"]["b_kept"]
        let_run = 1.0 - found["shares"]["a"] - found["shares"]["none"]
        shares = " ".join(f"{k} {v:.3f}" for k, v in found["shares"].items())
        print(
            f"{directory.name:36s} {shares}  steps {found['steps']}  B kept {kept:.3f}  "
            f"speed while let run {kept / let_run:.2f}"
        )


if __name__ == "__main__":
    main()
