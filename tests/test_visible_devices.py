"""Which physical GPU a CUDA device ordinal is, as the driver-level gate tells the daemon
(``visible_devices.h``), run on the CPU: the same rule as a rank's GPU (``ranks.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import build_gate_rule, run_gate_rule

from gpreempt.client.ranks import rank_gpu

# Reads "ORDINAL VALUE" lines (VALUE "-" for an unset variable, "_" for a space) and prints
# physical_gpu's answer to each.
PROGRAM = r"""
#include <cstdio>
#include <string>
#include "visible_devices.h"
int main() {
  int ordinal = 0;
  char value[128];
  while (std::scanf("%d %127s", &ordinal, value) == 2) {
    std::string v(value);
    for (char& c : v) { if (c == '_') c = ' '; }
    const char* visible = v == "-" ? nullptr : v.c_str();
    std::printf("%d\n", gpreempt_devices::physical_gpu(ordinal, visible));
  }
}
"""

CASES = [
    (0, None, 0),
    (3, None, 3),
    (64, None, -1),  # past the devices word's 64 bits
    (0, "2,3", 2),
    (1, "2,3", 3),
    (1, "2,_3", 3),
    (2, "2,3", -1),  # fewer entries than devices
    (0, "GPU-5e3b6c1a", -1),  # a UUID: not told
    (1, "0,GPU-5e3b6c1a", -1),
    (0, "0,GPU-5e3b6c1a", 0),
    (0, "7x", -1),
    (0, "", -1),
    (0, "99", -1),
    (-1, None, -1),
]


@pytest.fixture(scope="module")
def rule(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_gate_rule(tmp_path_factory.mktemp("devices"), PROGRAM)


def test_an_ordinal_is_the_physical_gpu_a_rank_would_name(rule: Path) -> None:
    lines = [f"{o} {'-' if v is None else (v or '_').replace(' ', '_')}" for o, v, _ in CASES]
    assert [int(x) for x in run_gate_rule(rule, lines)] == [want for _, _, want in CASES]
    for ordinal, visible, want in CASES:
        if ordinal >= 0 and want >= 0:  # where both can tell, they agree
            env = {"LOCAL_RANK": str(ordinal)}
            if visible is not None:
                env["CUDA_VISIBLE_DEVICES"] = visible.replace("_", " ")
            assert rank_gpu(env) == want, (ordinal, visible)
