// When the driver-level gate's CUPTI callbacks are on, and when its thread puts its barriers
// instead: without CUDA, so that a test on the CPU runs the rule (tests/test_driver_gate_mode.py).
//
// Never off while the gate is closed (its launches must wait) or a watched task is active (its
// launches put the barriers that the GPU-side check dates). A task nothing preempts (not bound)
// needs its callbacks otherwise only to tell its activity where neither the operator gate nor
// request() does; it sleeps else, since CUPTI's callbacks cost a server every launch. A task
// that may be preempted needs barriers while a more important task may start: it sleeps once
// the daemon says none was active for a while (sleep_ok) and no backlog keeps it awake; before
// that, it paces (asleep_drain.h) where it may: pacing asked for (GPREEMPT_DRIVER_PACED=1: off
// by default, as it cost the eager trainer's server more than it saved, docs/results.md), no
// trial failed lately, barriers hold, and no thread launches on its per-thread default stream,
// a stream no other thread can put barriers on.
//
// Asleep, a task nothing preempts lets CUPTI go (detached) once its GPUs are known and it has
// slept a while (driver_inject.cpp): a subscriber slows every graph launch of the process,
// callbacks on or off. It subscribes again when it must wake.
#pragma once

#include <cstdint>

namespace gpreempt_driver {

// What the gate's callbacks do: on (awake), or off with the gate's thread putting barriers
// (asleep, paced), or none, CUPTI let go (detached). The control block's driver_asleep word
// says which.
enum class Mode : uint32_t { kAwake = 0, kAsleep = 1, kPaced = 2, kDetached = 3 };

// What the choice reads, at one moment.
struct ModeFacts {
  bool bound = false;           // a task that may be preempted
  bool needs_launches = false;  // its activity is told from its launches alone
  bool closed = false;          // its gate is closed
  bool watched_active = false;  // a task it watches is active
  bool kept_awake = false;      // a backlog, or the look for new streams, keeps it awake
  bool sleep_ok = false;        // the daemon lets it sleep
  bool may_pace = false;        // pacing is on and would hold (above)
  bool devices_known = false;   // a context of the process was seen
  bool may_detach = false;      // asleep a while (or detached), detaching allowed, never failed
};

inline Mode wanted_mode(const ModeFacts& f) {
  if (f.needs_launches || f.closed || f.watched_active) {
    return Mode::kAwake;
  }
  if (!f.bound) {
    return f.devices_known && f.may_detach ? Mode::kDetached : Mode::kAsleep;
  }
  if (f.kept_awake) {
    return Mode::kAwake;
  }
  if (f.sleep_ok) {
    return Mode::kAsleep;
  }
  return f.may_pace ? Mode::kPaced : Mode::kAwake;
}

}  // namespace gpreempt_driver
