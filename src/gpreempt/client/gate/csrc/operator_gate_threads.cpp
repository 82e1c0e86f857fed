// The operator gate's background threads (see operator_gate.h): the one that notices the
// process's idleness, and the one that puts the gate to sleep while nobody can preempt it.

#include "operator_gate.h"

namespace gpreempt_gate {

// --- automatic activity: the background thread that notices idleness ----------------------------
void activity_loop(GateState* g) {
  const int64_t grace = static_cast<int64_t>(g->cfg.idle_grace_ms * 1e6);
  const int64_t poll = std::max<int64_t>(50000, std::min<int64_t>(grace / 4, 500000));
  bool device_set = false;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(g->bg_mu);
      g->bg_cv.wait_for(lock, std::chrono::milliseconds(200),
                        [g] { return g->bg_stop || g->active.load() != 0; });
      if (g->bg_stop) {
        return;
      }
      if (g->active.load() == 0) {
        continue;
      }
    }
    uint64_t seen = g->launches.load();
    int64_t quiet_since = 0;     // when the GPU was first seen done with everything up to `seen`
    bool tails_recorded = false;
    while (!g->uninstalled.load()) {
      sleep_ns(poll);
      const uint64_t now_launches = g->launches.load();
      if (now_launches != seen) {
        seen = now_launches;
        quiet_since = 0;
        tails_recorded = false;
        continue;
      }
      bool done = true;
      if (device_usable(g)) {
        std::lock_guard<std::mutex> lock(g->mu);
        try {
          if (!g->streams.empty()) {
            if (!device_set) {
              // so that restoring "the previous device" after a record never touches device 0
              g->impl->setDevice(g->streams.front().stream.device());
              device_set = true;
            }
            if (!tails_recorded) {
              tails_recorded = record_tails(g);
            }
            done = tails_recorded && tails_done(g);
            if (done) {
              reap(g);
            }
          }
        } catch (const std::exception& e) {
          note_error(g, "activity", e);
        }
      }
      if (!done) {
        quiet_since = 0;
        continue;
      }
      const int64_t now = now_ns();
      if (quiet_since == 0) {
        quiet_since = now;
      }
      if (now - quiet_since < grace) {
        continue;
      }
      // Idle. Clear the flag, then check no launch slipped in meanwhile (it would have seen
      // the flag still set and not published anything).
      g->active.store(0);
      if (g->launches.load() != seen) {
        g->active.exchange(1);
        seen = g->launches.load();
        quiet_since = 0;
        tails_recorded = false;
        continue;
      }
      publish_activity(g);
      break;
    }
    if (g->uninstalled.load()) {
      return;
    }
  }
}

namespace {

// How often the sleep thread looks at the words: often while asleep (until it wakes, what the
// process launches after a more important task starts is held only by the thread's barriers,
// or not at all without barriers), rarely while awake.
constexpr int64_t kAsleepPollNs = 200 * 1000;
constexpr int64_t kAwakePollNs = 10 * 1000 * 1000;
// Awake in a process whose launches tell its activity (a server without request()): it may
// sleep through each scope a marker opens, so it looks more often.
constexpr int64_t kAwakeActivityPollNs = 1000 * 1000;

// --- asleep while nobody can preempt this task ---------------------------------------------------
// A global operator callback costs a CPU-bound trainer several percent of its speed, even when
// it does nothing. A bound gate needs it only while a more important task on its GPU may start:
// the daemon says when none has been active for a while (sleep_ok, with nobody below this task
// and no peer taking turns with it), and then, as long as nobody closes the gate and no watched
// task is active, the callback is disabled. It comes back the moment any of that changes; the
// first launch after waking puts a stream barrier.
//
// While asleep with stream barriers, the sleep thread puts them instead of the operators: one
// every asleep_barrier_ms on the stream the process last launched on. So the GPU still stops
// this process's work the moment a more important task starts, within what it launched in that
// spacing, though nobody sees its operators. That holds for a process whose GPU keeps up with
// its CPU, the one the callback costs most; one that queues faster than its GPU runs leaves
// more work between two of them (a request would wait longer than asleep_max_drain_ms on
// average for the work ahead of the next barrier: the spans between two barriers weighted by
// themselves, since a request more likely arrives during a long one), so its gate wakes and
// stays awake backlog_hold_s, its operators bounding the queue again.
// Without barriers, what the process queues while asleep is not bounded.
//
// A bound gate whose control block the driver-level gate holds (driver.py: it sees every launch
// of the process, this gate's operators' among them, waits while the gate is closed, and puts
// the stream barriers, awake and asleep) stands aside: its callback would add its cost to every
// operator for nothing. It comes back the moment the driver-level gate lets go (a profiler took
// CUPTI) or fails, and while a graph is captured or an in-process scheduler binds threads.
bool driver_holds(GateState* g) {
  return g->cfg.bound && load32(g->ctl, kOffDriverGate) == kDriverOn;
}

// Whether the process's launches tell others when it is active: a gate that detects activity,
// in a process that has not said it with request() or a marker of whole requests (hinted),
// and has not handed it to a driver-level gate that holds CUPTI.
bool tells_activity(GateState* g) {
  return !g->cfg.bound && g->cfg.auto_activity && load32(g->ctl, kOffHinted) == 0 &&
         !activity_handed_now(g);
}

// A gate that handed its activity over tells it again while the driver-level gate does not
// hold CUPTI (activity_handed_now): a rise that gate left (its launches', before a profiler
// took CUPTI) is adopted, so that it drops here once the process has been idle for the grace.
void adopt_left_activity(GateState* g) {
  if (g->cfg.auto_activity && g->activity_handed.load(std::memory_order_relaxed) &&
      !activity_handed_now(g) && load32(g->ctl, kOffAutoActive) != 0 &&
      g->active.exchange(1) == 0) {
    {
      std::lock_guard<std::mutex> lock(g->bg_mu);
    }
    g->bg_cv.notify_one();  // its idle check drops the word after the grace time
  }
}

bool may_sleep(GateState* g) {
  if (driver_holds(g)) {
    return g->captures.load(std::memory_order_relaxed) == 0 &&
           !g_task_gates.load(std::memory_order_relaxed);
  }
  // a gate whose launches tell its activity keeps its hook but while a marker of a part of a
  // request (generate) holds a scope open: the process is active anyway, so the hook sleeps
  // through it without the daemon's word and wakes when the scope closes. Any other gate
  // sleeps while the daemon allows it.
  const bool allowed = tells_activity(g) ? load32(g->ctl, kOffRequests) != 0
                                         : load32(g->ctl, kOffSleepOk) != 0;
  return allowed && load32(g->ctl, kOffGateClosed) == 0 &&
         !watched_active(g->watch.load(std::memory_order_acquire)) &&
         g->captures.load(std::memory_order_relaxed) == 0 &&
         !g_task_gates.load(std::memory_order_relaxed) &&
         now_ns() >= g->awake_until_ns.load(std::memory_order_relaxed);
}

// Takes in the barriers put while asleep that the GPU has reached (mu held): each adds the GPU
// time of the work between it and the one before to the spans, their distance on the GPU less
// the time between their records if the GPU had reached the first before the second was
// recorded (it may have idled that long).
void learn_asleep_spans(GateState* g) {
  while (!g->asleep_marks.empty() && g->impl->queryEvent(g->asleep_marks.front().event)) {
    const AsleepMark mark = g->asleep_marks.front();
    g->asleep_marks.pop_front();
    const AsleepMark& before = g->asleep_reached;
    if (before.event != nullptr) {
      double ms = elapsed_ms(g->impl, before.event, mark.event, mark.stream.device_index());
      if (ms < 0.0) {
        ms = std::numeric_limits<double>::infinity();  // cannot tell: assume the worst
      } else if (!mark.backlogged) {
        ms = std::max(0.0, ms - static_cast<double>(mark.recorded_ns - before.recorded_ns) / 1e6);
      }
      g->asleep_wait.learn(ms);
      if (ms > g->asleep_longest_ms.load(std::memory_order_relaxed)) {
        g->asleep_longest_ms.store(ms, std::memory_order_relaxed);
      }
      give_event(g, before.event, before.stream.device_index());
    }
    g->asleep_reached = mark;
  }
}

// Gives back every event of the barriers put while asleep and forgets the spans (mu held): the
// gate woke, and the next sleep learns afresh.
void forget_asleep_marks(GateState* g) {
  for (const AsleepMark& mark : g->asleep_marks) {
    give_event(g, mark.event, mark.stream.device_index());
  }
  g->asleep_marks.clear();
  give_event(g, g->asleep_reached.event, g->asleep_reached.stream.device_index());
  g->asleep_reached.event = nullptr;
  g->asleep_wait.reset();
}

// What a request starting now would wait for on average (ms): the spans' GPU times weighted by
// themselves (mu held).
double asleep_drain_ms(const GateState* g) {
  return g->asleep_wait.ms();
}

// The sleep thread's barrier, while asleep: one every asleep_barrier_ms on the stream the
// process last launched on, with an event behind it. Returns false when the barriers no longer
// bound what a starting request would wait for: the gate must wake. `device_set`: the thread's
// device.
bool asleep_barrier(GateState* g, int64_t now, bool& device_set) {
  if (!barriers_hold(g)) {
    return true;  // off, or nobody more important is registered on this GPU
  }
  std::lock_guard<std::mutex> lock(g->mu);
  if (now < g->next_asleep_barrier_ns || !device_usable(g)) {
    return true;
  }
  g->next_asleep_barrier_ns = now + static_cast<int64_t>(g->cfg.asleep_barrier_ms * 1e6);
  try {
    // a gate that fell asleep before any launch of its process holds the default stream of the
    // current device, where an unconfigured process launches
    const c10::Stream stream = g->last_stream.device_type() != c10::kCPU
                                   ? g->last_stream
                                   : g->impl->getDefaultStream(g->impl->getDevice());
    if (!device_set) {
      // so that restoring "the previous device" after a record or a query (each sets the
      // stream's device for itself) never touches device 0
      g->impl->setDevice(stream.device());
      device_set = true;
    }
    if (g->impl->queryStream(stream)) {
      // nothing queued: a barrier would hold nothing, and would cost every other process on
      // the GPU a switch to this one
      return true;
    }
    if (!put_waits(g, stream)) {
      return true;
    }
    g->asleep_barriers.fetch_add(1, std::memory_order_relaxed);
    void* ev = take_event(g, stream.device_index());
    g->impl->record(&ev, stream, stream.device_index(), c10::EventFlag::BACKEND_DEFAULT);
    const bool backlogged =
        !g->asleep_marks.empty() && !g->impl->queryEvent(g->asleep_marks.back().event);
    g->asleep_marks.push_back(AsleepMark{ev, stream, now_ns(), backlogged});
    learn_asleep_spans(g);
    const double drain = asleep_drain_ms(g);
    g->asleep_drain_ms.store(drain, std::memory_order_relaxed);
    return !(drain > g->cfg.asleep_max_drain_ms);
  } catch (const std::exception& e) {
    barriers_failed(g, e);
    return true;
  }
}

void wake(GateState* g, at::CallbackHandle handle) {
  if (g->barriers.load()) {
    g->next_barrier_work.store(g->work_ns.load());  // a barrier at the first launch
  }
  at::reenableCallback(handle);
  g->asleep.store(false);
  std::lock_guard<std::mutex> lock(g->mu);
  forget_asleep_marks(g);
}

}  // namespace

void sleep_loop(GateState* g, at::CallbackHandle handle) {
  bool device_set = false;
  while (!g->uninstalled.load()) {
    const bool asleep = g->asleep.load();
    sleep_ns(asleep ? kAsleepPollNs : tells_activity(g) ? kAwakeActivityPollNs : kAwakePollNs);
    if (g->uninstalled.load()) {
      break;
    }
    adopt_left_activity(g);
    bool can = may_sleep(g);
    if (asleep && can && !driver_holds(g)) {
      const int64_t now = now_ns();
      if (!asleep_barrier(g, now, device_set)) {
        g->backlog_wakes.fetch_add(1);
        g->awake_until_ns.store(now + static_cast<int64_t>(g->cfg.backlog_hold_s * 1e9));
        can = false;
      }
    }
    if (asleep && !can) {
      wake(g, handle);
    } else if (!asleep && can) {
      at::disableCallback(handle);
      g->asleep.store(true);
      g->sleeps.fetch_add(1);
    }
  }
  if (g->asleep.load()) {
    wake(g, handle);
  }
}

}  // namespace gpreempt_gate
