// The driver-level gate asleep: its launch callbacks are off (nobody more important on its GPU
// was active for a while), so no launch puts a barrier. The gate's thread puts them instead,
// one every kAsleepBarrierNs on each stream the process launched on while awake, so the GPU
// still stops this process's queued work within about that much of it the moment a more
// important task starts; once the gate wakes, the GPU-side check dates these barriers as it
// dates the callbacks' (driver_verify.cpp). That holds for a process whose GPU keeps up with
// its CPU, the one the callbacks cost most. One that queues faster than its GPU runs (JAX and
// CuPy run far ahead) leaves more GPU work between two of them: once a request starting now
// would wait for more than kAsleepMaxDrainNs on average (the spans between two barriers,
// measured on the GPU, weighted by themselves), that stream's barriers come every
// kAsleepDenseBarrierNs, which splits a step queued at once into pieces; where the wait stays
// too long, the gate wakes for kBacklogHoldNs and its launches bound the queue again. Asleep,
// the gate sees no new stream: while barriers hold, it wakes for a few milliseconds every half
// second (discover_streams) to see them.
//
// A stream with nothing queued gets no barrier: the GPU would pass it at once, holding nothing,
// and each one costs every other process on the GPU a switch to this one (docs/results.md,
// "What the defaults cost a trainer nobody preempts": a suspect in what GEMM loops beside an
// idle gated process lost).
//
// A barrier must never land in a graph being captured: the capture calls keep their callbacks
// while asleep and count captures under way, a capture start waits for a barrier being put
// (the gate's mutex), and no barrier is put while one is under way.
#include <algorithm>
#include <array>
#include <iterator>

#include "driver_gate.h"

namespace gpreempt_driver {

namespace {

// Whether a barrier put now on `stream` would hold nothing: everything queued there completed,
// or it is a thread's per-thread default stream, which from this thread would be the gate's own
// (such a stream gets its barriers from its thread's launches while the gate is awake).
bool nothing_to_hold(CUstream stream) {
  return stream == CU_STREAM_PER_THREAD || cu()->cuStreamQuery(stream) == CUDA_SUCCESS;
}

// Retires the stream's completed asleep marks, learning the GPU time of the work between each
// two: their distance on the GPU, less the time between their records where the GPU had
// reached the first before the second was put (it may have idled that long). Asleep, the
// stream's AsleepDrain says when its barriers come denser or the gate wakes; paced, its
// PacedDrain says whether the trial failed (the return value).
bool learn_spans(Gate& g, StreamState& st, int64_t now, bool paced) {
  bool failed = false;
  retire_marks(g, st.context, st.asleep_marks, [&](const Mark& first, const Mark& second) {
    double ms = span_ms(first, second);
    if (ms < 0.0) {
      return;
    }
    const double wall_ms = static_cast<double>(second.recorded_ns - first.recorded_ns) / 1e6;
    if (!second.gpu_was_busy) {
      ms = std::max(0.0, ms - wall_ms);
    }
    if (paced) {
      failed = st.paced.too_long(ms, wall_ms) || failed;
    } else if (st.drain.learn(ms, now) == AsleepVerdict::kWake) {
      g.awake_until_ns.store(now + kBacklogHoldNs, std::memory_order_relaxed);
    }
  });
  return failed;
}

// A barrier of the gate's thread on `stream`, with its mark behind it appended to `line` (mu
// held): asleep, paced, and at a hold's rise. `before`: a timed event recorded before it (or
// null), given back where no mark keeps it. False where no barrier was put.
bool thread_barrier(Gate& g, uint8_t* ctl, StreamState& st, CUstream stream,
                    std::deque<Mark>& line, int64_t now, CUevent before, bool timed) {
  BarrierNote note;
  if (!put_barrier(g, ctl, stream, &note)) {
    give_event(g, st.context, before, true);
    return false;
  }
  add64(ctl, kOffDriverBarriers, 1);
  Mark m;
  if (record_mark(g, st.context, stream, line, &m, timed)) {
    m.before = before;
    m.recorded_ns = now;
    push_mark(st, line, m, note);
  } else {
    give_event(g, st.context, before, true);
  }
  return true;
}

}  // namespace

bool asleep_barriers(Gate& g, int64_t now, bool paced) {
  static int64_t last_ns = 0;  // the gate's one thread calls this
  uint8_t* ctl = g.ctl.load(std::memory_order_acquire);
  // paced, a stream's barriers come a barrier spacing of its GPU work apart; the loop's jitter
  // allowed for
  const int64_t spacing_ns = static_cast<int64_t>(g.cfg.barrier_us * 1e3);
  const int64_t jitter = paced ? kPacedMinNs / 4 : kAsleepDenseBarrierNs / 2;
  if (ctl == nullptr || now - last_ns < 2 * jitter || !barriers_hold(g, ctl)) {
    return false;
  }
  last_ns = now;
  const Guard guard;
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.captures.load() != 0) {
    return false;
  }
  const RelaxedCapture relaxed;
  bool failed = false;
  for (auto& [key, st] : g.streams) {
    const CUstream stream = key.stream;
    const CurrentContext current(st.context);
    failed = learn_spans(g, st, now, paced) || failed;
    failed = failed || (paced && paced_too_deep(st.asleep_marks.size(), spacing_ns,
                                                 g.cfg.window_ms));
    if (now < st.asleep_next_ns || st.asleep_marks.size() >= kAsleepMarksMax ||
        capturing(stream) || nothing_to_hold(stream)) {
      continue;
    }
    st.asleep_next_ns =
        now + (paced ? st.paced.every_ns(spacing_ns) : st.drain.every_ns) - jitter;
    // a span is timed in one of kAsleepTimedEvery (each of a paced trial's first
    // kPacedTimedFirst): from a timed mark's event to a timed event before the next mark's
    // barrier (a timed event costs the GPU about 1.8 us, an untimed one nothing measurable)
    const bool ends_span = !st.asleep_marks.empty() && st.asleep_marks.back().timed;
    CUevent before = ends_span ? record_event(g, st.context, stream, true) : nullptr;
    const bool timed = st.asleep_count % kAsleepTimedEvery == 0 ||
                       (paced && st.paced.learned < kPacedTimedFirst);
    // where none could be put (its context went away, say), the next try is a millisecond away
    if (thread_barrier(g, ctl, st, stream, st.asleep_marks, now, before, timed)) {
      ++st.asleep_count;
    }
  }
  if (failed) {
    for (auto& [key, st] : g.streams) {
      st.paced = PacedDrain{};  // the next trial learns afresh
    }
  }
  return failed;
}

void rise_barriers(Gate& g, int64_t now) {
  static HoldRise rise;  // the gate's one thread calls this
  uint8_t* ctl = g.ctl.load(std::memory_order_acquire);
  if (ctl == nullptr ||
      !rise.rose(load32(ctl, kOffGateClosed), g.watch.load(std::memory_order_acquire)) ||
      !barriers_hold(g, ctl)) {
    return;
  }
  const Guard guard;
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.captures.load() != 0) {
    return;
  }
  const RelaxedCapture relaxed;
  for (auto& [key, st] : g.streams) {
    const CUstream stream = key.stream;
    const CurrentContext current(st.context);
    if (capturing(stream) || nothing_to_hold(stream)) {
      continue;
    }
    thread_barrier(g, ctl, st, stream, st.marks, now, nullptr, false);
  }
}

void discover_streams(Gate& g, int64_t now) {
  static int64_t next_ns = 0;  // the gate's one thread calls this
  uint8_t* ctl = g.ctl.load(std::memory_order_acquire);
  if (ctl == nullptr || !barriers_hold(g, ctl)) {
    next_ns = 0;  // the next time they hold, at once
    return;
  }
  if (now < next_ns) {
    return;
  }
  next_ns = now + kDiscoverEveryNs;
  int64_t until = g.awake_until_ns.load(std::memory_order_relaxed);
  while (until < now + kDiscoverNs &&
         !g.awake_until_ns.compare_exchange_weak(until, now + kDiscoverNs)) {
  }
}

bool may_start_pacing(Gate& g) {
  const Guard guard;
  std::lock_guard<std::mutex> lock(g.mu);
  const RelaxedCapture relaxed(capture_possible(g));
  for (auto& [key, st] : g.streams) {
    // a stream whose paced spans were judged short paces again at once after each wake, though
    // the work it queued while held is deep
    if (st.paced.learned < kPacedTimedFirst && st.marks.size() > kPacedStartMarks) {
      const CurrentContext current(st.context);
      reap(g, st);  // a stream that stopped launching keeps its last marks until reaped
      if (st.marks.size() > kPacedStartMarks) {
        return false;  // a trial now would be judged only once its deep queue ran
      }
    }
  }
  return true;
}

void end_asleep_marks(Gate& g) {
  const Guard guard;
  std::lock_guard<std::mutex> lock(g.mu);
  const RelaxedCapture relaxed(capture_possible(g));
  for (auto& [key, st] : g.streams) {
    if (!st.asleep_marks.empty()) {
      // in the order they were put on the stream (a callback's mark may have come after the
      // thread's first): the GPU completes them in that order
      std::deque<Mark> line;
      std::merge(st.marks.begin(), st.marks.end(), st.asleep_marks.begin(),
                 st.asleep_marks.end(), std::back_inserter(line),
                 [](const Mark& a, const Mark& b) { return a.seq < b.seq; });
      st.marks.swap(line);
      st.asleep_marks.clear();
      const CurrentContext current(st.context);
      reap(g, st);
    }
    st.drain.reset();
    st.asleep_next_ns = 0;
  }
}

namespace {

// Stream captures start and end: their callbacks stay on while asleep.
constexpr CUpti_CallbackId kCaptureBegins[] = {
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz,
};
constexpr CUpti_CallbackId kCaptureEnds[] = {
    CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture,
    CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture_ptsz,
};

enum class Capture { kNone, kBegins, kEnds };

// Which capture call `cbid` is, from a table made once from the lists above: every launch's
// callback asks.
Capture capture_call(CUpti_CallbackId cbid) {
  using Table = std::array<Capture, CUPTI_DRIVER_TRACE_CBID_SIZE>;
  static const Table table = [] {
    Table t{};
    for (CUpti_CallbackId id : kCaptureBegins) {
      t[id] = Capture::kBegins;
    }
    for (CUpti_CallbackId id : kCaptureEnds) {
      t[id] = Capture::kEnds;
    }
    return t;
  }();
  return cbid < table.size() ? table[cbid] : Capture::kNone;
}

void capture_begins(Gate& g) {
  std::lock_guard<std::mutex> lock(g.mu);  // after any barrier being put
  g.captures.fetch_add(1);
}

void capture_ends(Gate& g) {
  // never below zero: a capture begun while a profiler held CUPTI ends unseen by its start
  int n = g.captures.load();
  while (n > 0 && !g.captures.compare_exchange_weak(n, n - 1)) {
  }
}

}  // namespace

bool enable_capture_callbacks(CUpti_SubscriberHandle subscriber) {
  bool ok = true;
  for (CUpti_CallbackId id : kCaptureBegins) {
    ok = cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id) == CUPTI_SUCCESS && ok;
  }
  for (CUpti_CallbackId id : kCaptureEnds) {
    ok = cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id) == CUPTI_SUCCESS && ok;
  }
  return ok;
}

bool on_capture_call(Gate& g, CUpti_CallbackId cbid, const CUpti_CallbackData* data) {
  switch (capture_call(cbid)) {
    case Capture::kBegins:
      if (data->callbackSite == CUPTI_API_ENTER) {
        capture_begins(g);
      } else if (*static_cast<const CUresult*>(data->functionReturnValue) != CUDA_SUCCESS) {
        capture_ends(g);  // it did not begin
      }
      return true;
    case Capture::kEnds:
      if (data->callbackSite == CUPTI_API_EXIT) {
        capture_ends(g);
      }
      return true;
    case Capture::kNone:
      break;
  }
  return false;
}

}  // namespace gpreempt_driver
