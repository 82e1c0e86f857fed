"""Whether Case-A runs at the load asked for, checked by one run of it alone before the repeats.

The arrival rate comes from the calibration's mean service time, but a server's requests may
take longer in a run of its own than in the calibration: the ResNet-50 graph server measured
1.26 ms at calibration and was busy 0.52-0.54 of the time alone at load 0.5, and an eager
server's mean service time moved between 4.1 and 7.3 ms from one process to the next on one
machine (``benchmarks/defaults/eager_service.py``). A run at another load than asked leaves its
trainers another share of the GPU. So Case-A first serves the run's arrivals once alone; where
the share of the window it was busy lies off the load by more than
:data:`~gpreempt.bench.load.LOAD_TOLERANCE`, the rate is scaled by load / busy. The arrivals
keep their shape: the same seed's draws, scaled.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from .load import corrected_rate, poisson_arrivals
from .scenario_metrics import a_busy
from .scenarios import Harness, run_scenario


def check_load(
    harness: Harness, directory: Path, load: float, rate: float, requests: int, seed: int
) -> tuple[float, dict[str, Any]]:
    """Serve ``requests`` arrivals at ``rate`` alone (in ``directory``) and return the rate to
    run at, with what was found (recorded in results.json as ``params.load_check``).

    Writes the arrivals it served to ``harness.arrivals_file``; the caller writes the final
    ones. A check run that failed leaves the rate as it was, and says why."""
    offsets = poisson_arrivals(requests, rate, seed)
    harness.arrivals_file.write_text(json.dumps(offsets))
    raw = run_scenario(
        replace(harness, planned_span_s=offsets[-1]), "a-alone", directory, offsets[-1]
    )
    busy = a_busy(raw.serve, raw.window) if raw.valid and raw.serve and raw.window else None
    new_rate = corrected_rate(rate, load, busy)
    found: dict[str, Any] = {
        "a_busy": busy,
        "rate_calibrated_per_s": rate,
        "corrected": new_rate != rate,
    }
    if not raw.valid:
        found["invalid_reason"] = raw.reason
    return new_rate, found
