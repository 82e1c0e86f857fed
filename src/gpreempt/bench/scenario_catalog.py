"""The scenarios ``gpreempt bench`` knows: their names, groups and descriptions, and how each
scenario with a private daemon sets up its tasks (:data:`DAEMON_SETUPS`).

A scenario is named once here; :mod:`.scenarios` runs it, :mod:`.scenario_metrics` and
:mod:`.report` describe it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import GpreemptError, UsageError
from ..names import MechanismName, PolicyName

BASELINES = ("a-alone", "b-alone", "sequential", "time-sliced", "stream-priority")
MPS_SCENARIOS = ("mps", "mps-priority")
#: The gate with every process a client of a private MPS daemon, Case-B below normal.
GATE_MPS_SCENARIO = "gpreempt-gate-mps"
#: Scenarios run under a private MPS daemon -> Case-B's CUDA_MPS_CLIENT_PRIORITY, if any.
MPS_B_PRIORITY: dict[str, str | None] = {
    "mps": None,
    "mps-priority": "1",
    GATE_MPS_SCENARIO: "1",
}
#: Mechanisms forced with ``--mechanism`` (scenario ``gpreempt`` names none: the default).
MECHANISMS = (MechanismName.SIGNAL, MechanismName.LOCK, MechanismName.GATE)
#: ``gpreempt``: both tasks with nothing but their priority set, as users run them.
DEFAULT_SCENARIO = "gpreempt"
#: The same, with a server that never calls ``gpreempt.request()``.
NO_REQUEST_SCENARIO = "gpreempt-no-request"
GPREEMPT_SCENARIOS = (
    DEFAULT_SCENARIO,
    NO_REQUEST_SCENARIO,
    *(f"gpreempt-{m}" for m in MECHANISMS),
)
#: Case-A alone once more, after every other scenario: its distance from ``a-alone`` is the
#: drift of Case-A's own latency over the run (an eager server's moves a lot). Measured
#: whenever a scenario shares the GPU.
A_AFTER = "a-alone-after"
#: Case-A alone under ``gpreempt run --priority high``, marking its requests or not: what the
#: tools library and the gate cost a server with nothing to preempt.
GATED_ALONE = ("a-alone-gated", "a-alone-gated-no-request")
#: Scenarios without Case-B: measured once per repeat for every Case-B kind of a run.
CASE_A_ONLY = ("a-alone", *GATED_ALONE, A_AFTER)
POLICY_SCENARIOS = ("gpreempt-timeslice", "gpreempt-share")
SCHEDULER_SCENARIO = "gpreempt-scheduler"
MEMORY_SCENARIOS = ("memory-pressure", "memory-pressure-baseline")
#: Run by default (``--quick`` stays within its time budget).
DEFAULT_SCENARIOS = BASELINES + MPS_SCENARIOS + GPREEMPT_SCENARIOS
#: Only when named in ``--scenarios`` (or ``--scenarios all``).
OPT_IN_SCENARIOS = (
    *GATED_ALONE,
    *POLICY_SCENARIOS,
    GATE_MPS_SCENARIO,
    SCHEDULER_SCENARIO,
    *MEMORY_SCENARIOS,
)
ALL_SCENARIOS = DEFAULT_SCENARIOS + OPT_IN_SCENARIOS + (A_AFTER,)
#: Case-B's guaranteed share in gpreempt-share (``gpreempt run --min-share``).
SHARE_MIN = 0.2

DESCRIPTIONS = {
    "a-alone": "Case-A alone (the reference for latency ratios)",
    "b-alone": "Case-B alone (the reference for B kept)",
    "sequential": "Case-A, then Case-B: no sharing (from a-alone and b-alone)",
    "time-sliced": "separate processes, default time slicing",
    "stream-priority": "one process: Case-A on a high-priority stream, Case-B in a thread",
    "mps": "separate processes under MPS",
    "mps-priority": "MPS with CUDA_MPS_CLIENT_PRIORITY=1 for Case-B",
    DEFAULT_SCENARIO: "gpreempt with its defaults: only --priority high / low",
    NO_REQUEST_SCENARIO: "gpreempt with its defaults, Case-A never calls gpreempt.request()",
    **{f"gpreempt-{m}": f"gpreempt, Case-B forced to --mechanism {m}" for m in MECHANISMS},
    A_AFTER: "Case-A alone again, after every other scenario (its drift over the run)",
    "a-alone-gated": "Case-A alone under gpreempt run --priority high (no Case-B)",
    "a-alone-gated-no-request": "the same, Case-A never calls gpreempt.request()",
    GATE_MPS_SCENARIO: "gpreempt, mechanism gate, all processes under MPS, Case-B below normal",
    "gpreempt-timeslice": "gpreempt, policy timeslice (slices 80 ms high / 20 ms low)",
    "gpreempt-share": f"gpreempt, policy share, Case-B --min-share {SHARE_MIN}",
    "gpreempt-scheduler": "one process: gpreempt.GPUScheduler, Case-A high, Case-B low",
    "memory-pressure": "gpreempt: Case-A grows beyond free memory, Case-B is evicted",
    "memory-pressure-baseline": "no gpreempt: Case-A grows beyond free memory",
}


@dataclass(frozen=True)
class DaemonSetup:
    """How a scenario with a private daemon starts it and its tasks."""

    policy: str = PolicyName.HPF
    b_mechanism: str | None = None  # None: the default (no --mechanism)
    b_options: tuple[str, ...] = ()
    a_request: bool = True  # Case-A marks its requests with gpreempt.request()


DAEMON_SETUPS: dict[str, DaemonSetup] = {
    DEFAULT_SCENARIO: DaemonSetup(),
    NO_REQUEST_SCENARIO: DaemonSetup(a_request=False),
    "a-alone-gated": DaemonSetup(),
    "a-alone-gated-no-request": DaemonSetup(a_request=False),
    **{f"gpreempt-{m}": DaemonSetup(b_mechanism=m) for m in MECHANISMS},
    GATE_MPS_SCENARIO: DaemonSetup(b_mechanism=MechanismName.GATE),
    "gpreempt-timeslice": DaemonSetup(policy=PolicyName.TIMESLICE),
    "gpreempt-share": DaemonSetup(
        policy=PolicyName.SHARE, b_options=("--min-share", str(SHARE_MIN))
    ),
    "memory-pressure": DaemonSetup(),
}


class ScenarioFailed(GpreemptError):
    """A scenario could not be measured; the message says why (it becomes the invalid reason)."""


def check_scenarios(names: Sequence[str]) -> tuple[str, ...]:
    """Validate scenario names (UsageError listing the known ones)."""
    unknown = [n for n in names if n not in ALL_SCENARIOS]
    if unknown:
        raise UsageError(
            f"unknown scenario(s) {', '.join(unknown)}: choose from {', '.join(ALL_SCENARIOS)}"
        )
    return tuple(dict.fromkeys(names))
