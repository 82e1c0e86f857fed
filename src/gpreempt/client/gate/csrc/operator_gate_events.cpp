// The operator gate's device events (see operator_gate.h): the pool, retiring completed ones
// (learning GPU time per launch), the streams' tail events, and the timing of one operator.

#include "operator_gate.h"

namespace gpreempt_gate {

// --- events (all with mu held) ----------------------------------------------------------------
void* take_event(GateState* g, c10::DeviceIndex device) {
  for (size_t i = g->free_events.size(); i-- > 0;) {
    if (g->free_events[i].first == device) {
      void* ev = g->free_events[i].second;
      g->free_events.erase(g->free_events.begin() + static_cast<std::ptrdiff_t>(i));
      return ev;
    }
  }
  return nullptr;  // record() creates one
}

void give_event(GateState* g, void* ev, c10::DeviceIndex device) {
  if (ev != nullptr) {
    g->free_events.emplace_back(device, ev);
  }
}

// An event completed: learn GPU time per launch from the previous completed one on its stream.
void retire_front(GateState* g) {
  Pending p = g->fifo.front();
  g->fifo.pop_front();
  if (p.backlogged && g->have_done && g->done.stream == p.stream && p.mark > g->done.mark) {
    double ms = -1.0;
    try {
      ms = elapsed_ms(g->impl, g->done.event, p.event, p.stream.device_index());
    } catch (const std::exception&) {
      ms = -1.0;  // no timestamp (the backend disables timing): count bound only
    }
    if (ms >= 0.0) {
      double per = ms * 1e6 / static_cast<double>(p.mark - g->done.mark);
      const double old = g->ns_per_launch.load(std::memory_order_relaxed);
      g->ns_per_launch.store(old <= 0.0 ? per : 0.8 * old + 0.2 * per,
                             std::memory_order_relaxed);
    }
  }
  if (g->have_done) {
    give_event(g, g->done.event, g->done.stream.device_index());
  }
  g->done = p;
  g->have_done = true;
}

namespace {

// Learns from the operator timings whose `after` event completed.
void take_samples(GateState* g) {
  while (!g->samples.empty() && g->impl->queryEvent(g->samples.front().after)) {
    const Sample smp = g->samples.front();
    g->samples.pop_front();
    double ms = -1.0;
    try {
      ms = elapsed_ms(g->impl, smp.before, smp.after, smp.device);
    } catch (const std::exception&) {
      ms = -1.0;
    }
    if (ms >= 0.0) {
      // 0 means "not learned": an operator that launches nothing costs 1 ns
      const uint32_t fresh = std::max<uint32_t>(1, static_cast<uint32_t>(std::min(ms * 1e6, 4e9)));
      const uint32_t old = smp.op->ns.load(std::memory_order_relaxed);
      const bool had_exact = smp.op->samples.load(std::memory_order_relaxed) > 0;
      uint32_t cost = old;
      if (smp.exact) {
        // exact timings average; the first replaces whatever bound stood in for it
        cost = had_exact ? static_cast<uint32_t>(0.75 * old + 0.25 * fresh) : fresh;
        smp.op->samples.fetch_add(1, std::memory_order_relaxed);
      } else {
        // an upper bound stands in (the tightest seen) until an exact timing comes: an
        // operator launched only onto an empty queue (one longer than the window is) is never
        // timed exactly, and is better counted a little too long than at the average
        if (!had_exact) {
          cost = old == 0 ? fresh : std::min(old, fresh);
        }
        smp.op->bounds.fetch_add(1, std::memory_order_relaxed);
      }
      smp.op->ns.store(std::max<uint32_t>(1, cost), std::memory_order_relaxed);
    }
    give_event(g, smp.before, smp.device);
    give_event(g, smp.after, smp.device);
  }
}

}  // namespace

void reap(GateState* g) {
  while (!g->fifo.empty() && g->impl->queryEvent(g->fifo.front().event)) {
    retire_front(g);
  }
  take_samples(g);
}

void wait_event(GateState* g, void* ev, MaybeNoGil& nogil) {
  for (int i = 0; i < 64; ++i) {
    if (g->impl->queryEvent(ev)) {
      return;
    }
    GATE_CPU_RELAX();
  }
  nogil.release();
  g->impl->synchronizeEvent(ev);
}

void remember_stream(GateState* g, const c10::Stream& s) {
  for (const auto& k : g->streams) {
    if (k.stream == s) {
      return;
    }
  }
  if (g->streams.size() >= 16) {
    // forget the oldest (its tail event has no timing: it cannot join the timed pool)
    if (g->streams.front().tail != nullptr) {
      g->impl->destroyEvent(g->streams.front().tail, g->streams.front().stream.device_index());
    }
    g->streams.erase(g->streams.begin());
  }
  g->streams.push_back(KnownStream{s, nullptr});
}

// Records a tail event on every stream the process launched on; returns false if it could not.
bool record_tails(GateState* g) {
  for (auto& k : g->streams) {
    if (stream_capturing(g->impl, k.stream)) {
      return false;
    }
    g->impl->record(&k.tail, k.stream, k.stream.device_index(), c10::EventFlag::PYTORCH_DEFAULT);
  }
  return true;
}

bool tails_done(GateState* g) {
  for (auto& k : g->streams) {
    if (k.tail != nullptr && !g->impl->queryEvent(k.tail)) {
      return false;
    }
  }
  return true;
}

// Records the event before the operator about to launch; its end, or the next operator's
// start, closes the timing.
void start_sample(GateState* g, OpCost* op) {
  std::unique_lock<std::mutex> lock(g->mu, std::try_to_lock);
  if (!lock.owns_lock() || g->sample_op != nullptr || !device_usable(g)) {
    return;  // busy: another call will do
  }
  try {
    const c10::Stream stream = g->impl->getStream(g->impl->getDevice());
    if (stream_capturing(g->impl, stream)) {
      return;
    }
    void* ev = take_event(g, stream.device_index());
    g->impl->record(&ev, stream, stream.device_index(), c10::EventFlag::BACKEND_DEFAULT);
    g->sample_before = ev;
    g->sample_op = op;
    g->sample_stream = stream;
    g->sample_thread.store(pthread_self(), std::memory_order_relaxed);
    g->sample_open.store(true, std::memory_order_release);
  } catch (const std::exception& e) {
    note_error(g, "sample", e);
  }
}

// Closes the open timing as its operator ends or before the next one launches (see Sample for
// what it measures).
void finish_sample(GateState* g) {
  MaybeNoGil nogil;
  const auto lock = lock_without_gil(g->mu, nogil);
  if (g->sample_op == nullptr) {
    return;  // another thread closed it
  }
  void* before = g->sample_before;
  OpCost* op = g->sample_op;
  const c10::Stream stream = g->sample_stream;
  g->sample_before = nullptr;
  g->sample_op = nullptr;
  g->sample_open.store(false, std::memory_order_release);
  try {
    const bool same_stream = g->impl->getStream(g->impl->getDevice()) == stream;
    if (same_stream && !stream_capturing(g->impl, stream)) {
      const bool exact = !g->impl->queryEvent(before);
      void* after = take_event(g, stream.device_index());
      g->impl->record(&after, stream, stream.device_index(), c10::EventFlag::BACKEND_DEFAULT);
      g->samples.push_back(Sample{before, after, op, stream.device_index(), exact});
      return;
    }
    g->samples_dropped.fetch_add(1, std::memory_order_relaxed);
    give_event(g, before, stream.device_index());
  } catch (const std::exception& e) {
    note_error(g, "sample", e);
  }
}

}  // namespace gpreempt_gate
