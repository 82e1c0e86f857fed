// The operator gate's slow paths (see operator_gate.h): waiting at a closed gate, publishing
// the process's activity, and bounding the work in flight (the window).

#include "operator_gate.h"

namespace gpreempt_gate {

void ring(GateState* g) {
  if (g->doorbell < 0) {
    return;
  }
  uint64_t one = 1;
  ssize_t ignored = write(g->doorbell, &one, sizeof(one));  // EAGAIN: it is ringing already
  (void)ignored;
}

// Whether the driver-level gate tells the activity now: handed to it (hand_activity), and it
// holds CUPTI. While a profiler holds CUPTI (or the gate failed) its callbacks see nothing, and
// this gate tells the activity again, as it sees it: better than none.
bool activity_handed_now(const GateState* g) {
  return g->activity_handed.load(std::memory_order_relaxed) &&
         load32(g->ctl, kOffDriverGate) == kDriverOn;
}

// Writes the activity flag as it is now; whoever changed it last publishes last. Nothing while
// the driver-level gate publishes it (activity_handed_now).
void publish_activity(GateState* g) {
  std::lock_guard<std::mutex> lock(g->publish_mu);
  if (activity_handed_now(g)) {
    return;
  }
  set_activity_word(g->ctl, kOffAutoActive, g->active.load());
  ring(g);
}

void note_error(GateState* g, const char* where, const std::exception& e) {
  // Called with mu held. The gate keeps honouring gate_closed; it stops using events.
  g->failed.store(true);
  g->error = std::string(where) + ": " + e.what();
}

bool device_usable(GateState* g) {
  return g->impl != nullptr && g->device_live.load(std::memory_order_relaxed) &&
         !g->failed.load(std::memory_order_relaxed) &&
         g->captures.load(std::memory_order_relaxed) == 0;
}

namespace {

bool is_tight(GateState* g, int64_t now) {
  switch (g->cfg.mode) {
    case kTight:
      return true;
    case kOpen:
      return false;
    default:
      // tight while the daemon gives this task a share (someone more important is registered
      // on its GPU and may start any moment), and for a while after the gate last closed;
      // with barriers a share needs no tight window: a preemption drains only to the next
      // barrier, so the CPU may run ahead
      if (load32(g->ctl, kOffWindowShareUs) != 0) {
        return !barriers_hold(g);
      }
      return now - g->last_closed_ns.load(std::memory_order_relaxed) <
             static_cast<int64_t>(g->cfg.tight_hold_ms * 1e6);
  }
}

// --- slow paths -------------------------------------------------------------------------------
// How long a thread sleeps at a gate the daemon closed: the daemon wakes it as it opens the gate
// (a futex), so this only paces the retiring of completed events; short sleeps would cost a
// peer that waits for its turn a core's worth of wake-ups.
constexpr int64_t kClosedSleepNs = 1000000;

}  // namespace

// Waits while `word` is nonzero or, with `watch`, while must_wait() says so (the gate's own word,
// under its watch list). `woken`: whoever opens `word` wakes its waiters (the daemon's
// gate_closed), so a closed word needs no polling; one closed only while watched tasks are
// active is polled, since they open it without a wake.
void wait_open(GateState* g, const uint32_t* word, bool watch, bool woken) {
  if (g->captures.load(std::memory_order_relaxed) > 0) {
    return;  // an operator being captured into a graph launches nothing now
  }
  MaybeNoGil nogil;
  nogil.release();
  const int64_t start = now_ns();
  g->last_closed_ns.store(start, std::memory_order_relaxed);
  store64(g->ctl, kOffWaits, g->waits.fetch_add(1) + 1);
  const int64_t poll = static_cast<int64_t>(g->cfg.poll_us * 1000.0);
  int64_t last_reap = start;
  for (int spins = 0;;) {
    const uint32_t seen = __atomic_load_n(word, __ATOMIC_RELAXED);
    const WatchList* list = watch ? g->watch.load(std::memory_order_acquire) : nullptr;
    if (watch ? !must_wait(g, seen, list) : seen == 0) {
      break;
    }
    if (g->uninstalled.load(std::memory_order_relaxed)) {
      break;
    }
    if (spins < 256) {
      ++spins;
      GATE_CPU_RELAX();
      continue;
    }
    const int64_t now = now_ns();
    if (now - last_reap > 1000000 && device_usable(g)) {
      // retire what completed meanwhile, so the window restarts from what is really in flight
      last_reap = now;
      std::unique_lock<std::mutex> lock(g->mu, std::try_to_lock);
      if (lock.owns_lock()) {
        try {
          reap(g);
        } catch (const std::exception& e) {
          note_error(g, "query", e);
        }
      }
    }
    if (seen != 0 && !closed_while_watched(seen, list)) {
      wait_word(word, seen, woken ? kClosedSleepNs : poll);
    } else {
      sleep_ns(poll);  // a watched task's words: polled (its end wakes no one here)
    }
  }
  const int64_t end = now_ns();
  g->last_closed_ns.store(end, std::memory_order_relaxed);
  store64(g->ctl, kOffWaitNs, g->wait_ns.fetch_add(end - start) + (end - start));
}

void mark_active(GateState* g) {
  if (g->active.exchange(1) == 0) {
    g->activations.fetch_add(1, std::memory_order_relaxed);
    publish_activity(g);
    {
      std::lock_guard<std::mutex> lock(g->bg_mu);
    }
    g->bg_cv.notify_one();
  }
}

// Every `segment` launches or half window of work: record an event, retire completed ones,
// enforce the window. `n`: launches so far, this one included; `work`: estimated work launched
// before this one; `cost`: this one's. `force`: run even if another thread already took this
// segment (to learn the stream now).
void segment(GateState* g, uint64_t n, uint64_t work, uint64_t cost, bool force) {
  MaybeNoGil nogil;
  const auto lock = lock_without_gil(g->mu, nogil);
  if (!force && n < g->next_mark.load(std::memory_order_relaxed) &&
      work + cost < g->next_work_mark.load(std::memory_order_relaxed)) {
    return;  // another thread took this segment
  }
  const int64_t now = now_ns();
  const uint32_t generation = load32(g->ctl, kOffGeneration);
  if (generation != g->seen_generation) {
    // the daemon changed the gate since we last looked: someone more important is around
    g->seen_generation = generation;
    g->last_closed_ns.store(now, std::memory_order_relaxed);
  }
  const bool tight = is_tight(g, now);
  g->tight_now.store(tight, std::memory_order_relaxed);
  g->next_mark.store(n + (tight ? g->cfg.record_every : g->cfg.open_record_every),
                     std::memory_order_relaxed);
  store64(g->ctl, kOffLaunches, n);
  if (!device_usable(g)) {
    return;
  }
  try {
    const c10::Stream stream = g->impl->getStream(g->impl->getDevice());
    if (stream_capturing(g->impl, stream)) {
      return;
    }
    remember_stream(g, stream);
    g->last_stream = stream;
    if (!g->cfg.bound) {
      return;
    }
    const bool first = g->fifo.empty();
    const uint64_t begin = first ? (g->have_done ? g->done.mark : n) : g->fifo.back().mark;
    const uint64_t begin_work =
        first ? (g->have_done ? g->done.mark_work : work) : g->fifo.back().mark_work;
    void* ev = take_event(g, stream.device_index());
    g->impl->record(&ev, stream, stream.device_index(), c10::EventFlag::BACKEND_DEFAULT);
    const bool backlogged = !g->fifo.empty() && g->fifo.back().stream == stream &&
                            !g->impl->queryEvent(g->fifo.back().event);
    g->fifo.push_back(Pending{ev, begin, n, begin_work, work, stream, backlogged});
    g->events_recorded.fetch_add(1, std::memory_order_relaxed);
    reap(g);

    const uint64_t by_count = tight ? g->cfg.window_launches : g->cfg.open_window_launches;
    double window_ms = tight ? g->cfg.window_ms : g->cfg.open_window_ms;
    const uint32_t share_us = load32(g->ctl, kOffWindowShareUs);
    if (tight && share_us != 0) {
      // the daemon's share of this GPU's in-flight budget: other tasks drain before us too
      const double share_ms = share_us / 1000.0;
      window_ms = window_ms > 0.0 ? std::min(window_ms, share_ms) : share_ms;
    }
    // The bound in time applies to the estimated work (each operator at its own learned cost,
    // untimed ones at the average), checked every half window of it so that it holds at the
    // granularity it asks for while the GPU always has the other half queued.
    const bool by_time = window_ms > 0.0;  // untimed operators count 0 until an average is known
    const uint64_t window_ns = by_time ? static_cast<uint64_t>(window_ms * 1e6) : 0;
    g->window_ns = static_cast<double>(window_ns);
    g->next_work_mark.store(by_time ? work + cost + std::max<uint64_t>(1, window_ns / 2)
                                    : std::numeric_limits<uint64_t>::max(),
                            std::memory_order_relaxed);
    // published in launches at the average cost, as the daemon and `status` show it
    uint64_t window = by_count;
    const double per_launch = g->ns_per_launch.load(std::memory_order_relaxed);
    if (by_time && per_launch > 0.0 && window_ms * 1e6 / per_launch < static_cast<double>(window)) {
      window = static_cast<uint64_t>(window_ms * 1e6 / per_launch);
    }
    g->window.store(static_cast<uint32_t>(std::min<uint64_t>(window, UINT32_MAX)),
                    std::memory_order_relaxed);
    store32(g->ctl, kOffWindow, g->window.load(std::memory_order_relaxed));
    const uint64_t after = work + cost;  // the estimated work once this operator is launched
    auto over = [&](const Pending& front) {
      return n - front.begin > by_count || (by_time && after - front.begin_work > window_ns);
    };
    int64_t waited_from = 0;
    while (!g->fifo.empty() && over(g->fifo.front())) {
      if (waited_from == 0) {
        waited_from = now_ns();
      }
      wait_event(g, g->fifo.front().event, nogil);
      retire_front(g);
    }
    if (waited_from != 0) {
      g->bound_waits.fetch_add(1, std::memory_order_relaxed);
      g->bound_wait_ns.fetch_add(now_ns() - waited_from, std::memory_order_relaxed);
    }
  } catch (const std::exception& e) {
    note_error(g, "event", e);
  }
}

}  // namespace gpreempt_gate
