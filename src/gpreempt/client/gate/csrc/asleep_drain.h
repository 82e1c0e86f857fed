// What a request starting now would wait for behind an asleep gate's barriers, and what the
// driver-level gate does about it: without CUDA or PyTorch, so that both gates share the
// reckoning and a test on the CPU runs the rule (tests/test_driver_gate_asleep.py).
//
// A gate asleep has a thread put its stream barriers, and learns from events beside them the
// GPU work between two: a request starting now would wait, on average, for those spans weighted
// by themselves (it more likely arrives during a long one), over about the last kDrainSpans of
// them (ExpectedWait; the operator gate's sleep thread wakes its gate where that exceeds
// GateConfig.asleep_max_drain_ms).
//
// The driver-level gate's thread puts a barrier on each stream it knows every
// kAsleepBarrierNs. Once the wait exceeds kAsleepMaxDrainNs (the process queues faster than
// its GPU runs), the stream's barriers come every kAsleepDenseBarrierNs instead, and if the
// wait stays too long for kAsleepBacklogNs the gate wakes (AsleepDrain). A process that queues
// a whole step at once (JAX, CuPy) mostly needs the denser barriers, not the callbacks; a loop
// that never waits for its GPU fills its queue as fast as its CPU launches, at its start and
// after each time it waited, leaving long spans that a moment of waiting does not outweigh:
// only a backlog that lasts wakes the gate, not the filling of a queue.
//
// Paced: a gate that is awake (a more important task was active lately) but whose process
// queues about as fast as its GPU runs needs its callbacks no more than an asleep one does. Its
// thread then puts the barriers, a barrier spacing of GPU work apart: the spans tell how much
// GPU work the process queues per unit of wall time, and the thread's barriers come that much
// closer in time (down to kPacedMinNs, its loop's tick); CUPTI's callback on every launch costs
// the process nothing. A process that queues much faster (a step at once, as JAX and CuPy do)
// leaves longer spans: once a request would wait for more than kPacedMaxWaitNs on average, the
// trial failed (PacedDrain), the gate's callbacks come back on, and the next trial waits twice
// as long as the last (PacedTrials), so a process that never keeps pace is tried ever more
// rarely. Spans are judged only once the GPU ran them, so a trial starts only where no stream
// has more than kPacedStartMarks marks in flight (about 2 ms of GPU work), and the first
// kPacedTimedFirst spans of a trial are all timed: they are judged within milliseconds; a
// stream whose first kPacedTimedFirst spans were judged short paces again after each wake
// (each request of a more important task), whatever it queued while held. Without
// the callbacks nothing bounds the queue: a stream whose paced marks in flight come to more
// than twice its window of GPU work fails the trial at once (paced_too_deep).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace gpreempt_asleep {

constexpr double kDrainSpans = 50.0;

// The expected wait of a request starting now behind the barriers whose spans were learned.
struct ExpectedWait {
  double sum_ms = 0.0;     // the spans' GPU times, decaying
  double square_ms = 0.0;  // ... and their squares

  void learn(double ms) {
    const double keep = 1.0 - 1.0 / kDrainSpans;
    sum_ms = sum_ms * keep + ms;
    square_ms = square_ms * keep + ms * ms;
  }
  double ms() const { return sum_ms > 0.0 ? square_ms / sum_ms : 0.0; }
  void reset() { *this = ExpectedWait{}; }
};

}  // namespace gpreempt_asleep

namespace gpreempt_driver {

constexpr int64_t kAsleepBarrierNs = 1000 * 1000;
constexpr int64_t kAsleepDenseBarrierNs = 250 * 1000;
constexpr int64_t kAsleepMaxDrainNs = 2 * 1000 * 1000;
constexpr int64_t kAsleepBacklogNs = 100 * 1000 * 1000;

// What the gate does after a span was learned.
enum class AsleepVerdict {
  kKeep,    // the barriers' spacing holds what it should
  kDenser,  // the stream's barriers now come every kAsleepDenseBarrierNs
  kWake,    // even so, the wait stayed too long: the gate wakes
};

// One stream's reckoning while its driver-level gate sleeps.
struct AsleepDrain {
  gpreempt_asleep::ExpectedWait wait;
  int64_t every_ns = kAsleepBarrierNs;  // the stream's barriers' spacing
  int64_t backlog_since_ns = 0;  // the wait at dense barriers too long since (0: it is not)

  // Takes in the GPU time of one span (ms), learned at `now`.
  AsleepVerdict learn(double ms, int64_t now) {
    wait.learn(ms);
    if (!(wait.ms() * 1e6 > static_cast<double>(kAsleepMaxDrainNs))) {
      backlog_since_ns = 0;
      return AsleepVerdict::kKeep;
    }
    if (every_ns > kAsleepDenseBarrierNs) {
      every_ns = kAsleepDenseBarrierNs;
      wait.reset();  // learned afresh at the new spacing
      return AsleepVerdict::kDenser;
    }
    if (backlog_since_ns == 0) {
      backlog_since_ns = now;
    }
    return now - backlog_since_ns >= kAsleepBacklogNs ? AsleepVerdict::kWake
                                                      : AsleepVerdict::kKeep;
  }

  // The gate woke (or the stream is gone): its next sleep learns afresh.
  void reset() { *this = AsleepDrain{}; }
};

constexpr int64_t kPacedMaxWaitNs = 500 * 1000;
constexpr int64_t kPacedMinNs = 100 * 1000;
constexpr size_t kPacedStartMarks = 10;
constexpr int kPacedTimedFirst = 8;
constexpr int64_t kPacedFirstHoldNs = 4LL * 1000 * 1000 * 1000;
constexpr int64_t kPacedLongestHoldNs = 256LL * 1000 * 1000 * 1000;

// One stream's reckoning while its gate is paced: kept across the gate's wakes (a more
// important task's every request wakes it), forgotten where a trial failed.
struct PacedDrain {
  gpreempt_asleep::ExpectedWait wait;
  double rate = 1.0;  // GPU time the process queues per unit of wall time, of late
  int learned = 0;    // spans taken in

  // Takes in one span: `ms` of GPU work between two barriers put `wall_ms` apart; true where a
  // request would now wait too long.
  bool too_long(double ms, double wall_ms) {
    if (wall_ms > 0.0) {
      rate = 0.7 * rate + 0.3 * (ms / wall_ms);
    }
    wait.learn(ms);
    ++learned;
    return wait.ms() * 1e6 > static_cast<double>(kPacedMaxWaitNs);
  }
  // The wall time between two barriers that leaves `spacing_ns` of GPU work between them.
  int64_t every_ns(int64_t spacing_ns) const {
    const double every = static_cast<double>(spacing_ns) / std::max(rate, 1.0);
    return std::max(kPacedMinNs, static_cast<int64_t>(every));
  }
};

// Whether `pending` paced marks in flight, `spacing_ns` of GPU work apart at the least, come to
// more than twice `window_ms` of GPU work.
inline bool paced_too_deep(size_t pending, int64_t spacing_ns, double window_ms) {
  return static_cast<double>(pending) * static_cast<double>(spacing_ns) > 2.0 * window_ms * 1e6;
}

// When the gate may try pacing again (the gate's thread's alone).
struct PacedTrials {
  int64_t not_before_ns = 0;
  int64_t hold_ns = kPacedFirstHoldNs;  // the wait after the next trial that fails

  bool allowed(int64_t now) const { return now >= not_before_ns; }
  void failed(int64_t now) {
    not_before_ns = now + hold_ns;
    hold_ns = std::min(hold_ns * 2, kPacedLongestHoldNs);
  }
};

}  // namespace gpreempt_driver
