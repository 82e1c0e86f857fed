// The activity check of a task that preempts others: auto_active drops once its streams
// drained and it launched nothing for the grace time (driver_gate.h, check_idle).
#include <algorithm>
#include <limits>

#include "driver_gate.h"

namespace gpreempt_driver {

namespace {

constexpr int64_t kNothingDue = std::numeric_limits<int64_t>::max();
constexpr int64_t kIdlePollMinNs = 50 * 1000;

// Whether the GPU has completed everything the process launched: an event behind each
// stream's last launch, recorded once per burst of launches, is queried. A per-thread default
// stream is its launching thread's own: from this thread the event goes on the legacy default
// stream, which waits for the work of every blocking stream of the context, theirs included
// (but not while a capture is under way in the process, which the legacy stream would break).
bool work_done(Gate& g) {
  const Guard guard;
  std::lock_guard<std::mutex> lock(g.mu);
  const RelaxedCapture relaxed;
  bool done = true;
  for (auto& [key, st] : g.streams) {
    const bool per_thread = key.stream == CU_STREAM_PER_THREAD;
    const CUstream tail = per_thread ? CU_STREAM_LEGACY : key.stream;
    const CurrentContext current(st.context);
    Mark m;
    if (st.dirty && per_thread && g.captures.load() != 0) {
      done = false;  // looked at once the capture ended
    } else if (st.dirty) {
      if (!capturing(tail) && record_mark(g, st.context, tail, st.marks, &m, false)) {
        m.launches = st.since_mark;
        m.gpu_was_busy = false;  // a burst's tail: no span the GPU ran through to learn from
        push_mark(st, st.marks, m, BarrierNote{});
        st.since_mark = 0;
      }
      st.dirty = false;
    }
    if (!st.marks.empty() && cu()->cuEventQuery(st.marks.back().event) == CUDA_ERROR_NOT_READY) {
      done = false;
    }
    reap(g, st);
  }
  return done;
}

}  // namespace

int64_t check_idle(Gate& g, int64_t now) {
  uint8_t* ctl = g.ctl.load(std::memory_order_acquire);
  if (ctl != nullptr) {
    follow_activity_word(g, ctl, now);  // what the operator gate told while CUPTI was away
  }
  if (ctl == nullptr || g.active.load() == 0) {
    g.quiet_since_ns = 0;
    return kNothingDue;
  }
  const int64_t grace = static_cast<int64_t>(g.cfg.idle_grace_ms * 1e6);
  // while its work runs, looked at as often as the operator gate's thread looks
  const int64_t poll = std::max<int64_t>(kIdlePollMinNs, grace / 4);
  const int64_t last = g.last_launch_ns.load(std::memory_order_acquire);
  const bool quiet = g.quiet_since_ns != 0 && last < g.quiet_since_ns;
  if (!quiet && now - last < grace) {
    g.quiet_since_ns = 0;
    return last + grace - now;  // it launched within the grace: nothing to look at yet
  }
  if (quiet && now - g.quiet_since_ns < grace) {
    return g.quiet_since_ns + grace - now;  // its work completed, nothing launched since
  }
  if (!work_done(g)) {
    g.quiet_since_ns = 0;
    return poll;
  }
  if (!quiet) {
    g.quiet_since_ns = now;  // first seen done with everything launched so far
  }
  if (now - g.quiet_since_ns < grace) {
    return g.quiet_since_ns + grace - now;
  }
  if (g.active.exchange(0) == 0) {
    return kNothingDue;
  }
  g.quiet_since_ns = 0;
  set_activity_word(ctl, kOffAutoActive, 0);
  if (g.last_launch_ns.load(std::memory_order_acquire) > now) {
    // a launch came in meanwhile, and saw the gate still active: it stays active
    g.active.store(1);
    set_activity_word(ctl, kOffAutoActive, 1);
  }
  ring(g);
  return kNothingDue;
}

}  // namespace gpreempt_driver
