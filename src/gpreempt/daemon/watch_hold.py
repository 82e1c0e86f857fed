"""Whether a task is held on the CPU by a task it watches, and stays so between two looks: the
backstop's check of a hold that no barrier stands behind (backstop.py).

A gate closed only while the tasks it watches are active (its word 2V) goes on by itself once
none is. Where barriers hold its queue on the GPU, the CPU may queue on behind them and its
launches prove nothing; without barriers (a task at ``high`` or above, below a more important
one) every launch waits on the CPU while a watched task is active, so they must stand still.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..control_block import ControlBlock
from ..priority import NAMED
from .task import Task

#: The blocks (task id, connection) the gate of a connection watches, by its id.
Watching = Callable[[int], tuple[tuple[int, int], ...]]


def held_by_watch(
    task: Task, tasks: Mapping[int, Task], watching: Watching
) -> tuple[bool, tuple[int, ...]]:
    """Whether every gate of ``task`` holds each launch on the CPU now only because a task
    it watches is active (its word closed while watched, 2V; a watched block active by its
    own words, read now), and the activity epochs of the blocks they watch.

    Such a gate goes on by itself once none is active, so its launches alone prove
    nothing; but between two looks that both find it so with the epochs unchanged, a
    watched task stayed active throughout (each rise bumps its epoch) and every launch had
    to wait. Only where no barrier lets the CPU queue on behind: no operator gate's
    barriers, and no driver-level gate that may put them (one below ``high``); and only once
    its driver-level gates are awake (a gate asleep or detached wakes first, and its
    launches until then are its reaction time, not a leak)."""
    epochs: list[int] = []
    unbarred = not task.barriers_on and (task.priority >= NAMED["high"] or task.driver_gate != "on")
    held = unbarred and bool(task.controls)
    for conn, control in task.controls.items():
        watched = [
            tasks[t].controls[c] for t, c in watching(conn) if t in tasks and c in tasks[t].controls
        ]
        epochs += [block.activity_epoch for block in watched]
        word = control.gate_word
        held = held and word != 0 and word % 2 == 0 and any(b.is_active() for b in watched)
        held = held and _awake(control)
    return held, tuple(epochs)


def _awake(control: ControlBlock) -> bool:
    """Whether its driver-level gate's callbacks are on: they see (and hold) its launches."""
    stats = control.stats()
    return not (stats.driver_asleep or stats.driver_paced)
