// The driver-level launch gate: what its files share.
//
// The CUDA driver loads this library into every process of a task that `gpreempt run` starts
// (CUDA_INJECTION64_PATH) and calls InitializeInjection at cuInit. From there CUPTI's callback
// API calls before_launch/after_launch on the launching thread for every kernel launch, graph
// launch and asynchronous copy or memset of the process, whatever issued it: PyTorch, Triton,
// CuPy, JAX, TensorFlow or a C++ program. The gate then does what the PyTorch operator gate does
// for operators, for every launch:
//   * driver_hold.cpp: wait while the control block's gate_closed says so (or a watched, more
//     important task is active and no stream barrier holds this task), count launches, the
//     way the HIP launch gate does (launch_hold.h, which both gates share);
//   * driver_marks.cpp: stream barriers (waits on the gate word, on the GPU) on each stream it
//     sees, spaced by the GPU time they hold, events behind them, and the bound on the work in
//     flight;
//   * driver_activity.cpp: a process that preempts others publishes its activity from its
//     launches, and drops it once its streams drained;
//   * driver_verify.cpp: the check that the barriers hold, the thread's included;
//   * driver_inject.cpp: the callback, the gate's thread, what the Python client calls;
//     driver_cupti.cpp: CUPTI's subscriber, callbacks off while the gate may sleep and on when
//     it must wake, CUPTI let go while nothing needs it, given to a profiler and taken back;
//   * driver_asleep.cpp: while the callbacks are off (asleep or paced), stream barriers put by
//     the gate's thread, and waking the gate where the process queues faster than they bound;
//   * driver_contexts.cpp: the GPUs of its contexts, told to the daemon; dead ones, forgotten;
//   * driver_channel.cpp: in a process with no Python client (a C++ program, a JAX process),
//     the gate's own channel to the daemon, with the same control block protocol;
//     driver_stranded.cpp: its watched blocks, freed where their owner exits after the daemon.
#pragma once

#include <cuda.h>
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "control_layout.h"
#include "asleep_drain.h"
#include "barrier_check.h"
#include "callback_mode.h"
#include "gate_words.h"
#include "launch_hold.h"

namespace gpreempt_driver {

using namespace gpreempt_layout;
using namespace gpreempt_words;

// Settings, from the Python client (adopt) or the environment (own channel); a bound task of
// this gate also gets stream barriers and a bounded queue.
struct Config : HoldConfig {
  double barrier_us = 200.0;  // GPU time between two barriers on a stream; 0 = no barriers
  double window_ms = 25.0;    // GPU time in flight at most on a stream
};

// Asleep: the spacing of the thread's barriers and when a backlog wakes the gate are in
// asleep_drain.h; a backlog keeps it awake kBacklogHoldNs. One asleep span in kAsleepTimedEvery
// is timed (a timed event costs an H100 about 1.8 us; docs/results.md).
constexpr int64_t kBacklogHoldNs = 2000LL * 1000 * 1000;
constexpr uint64_t kAsleepTimedEvery = 4;
// Asleep marks a stream may have pending at most: half a second of dense barriers (a loop that
// never waits for its GPU may queue all the driver takes; the span past the last wakes the gate).
constexpr size_t kAsleepMarksMax = 2048;
// The callbacks see which streams a process launches on; asleep or paced, they do not. While
// barriers hold, the gate wakes for kDiscoverNs every kDiscoverEveryNs (and at once when they
// start to hold), so that every stream a process made since gets barriers.
constexpr int64_t kDiscoverNs = 5 * 1000 * 1000;
constexpr int64_t kDiscoverEveryNs = 500LL * 1000 * 1000;

// One mark in kTimedEvery starts a timed span: a timed event costs an H100 about 1.8 us, an
// untimed one nothing measurable (benchmarks/driver_gate/barrier_cost.cu). With a mark every
// 0.2 ms of GPU time, one in 32 learns the GPU time per launch every few ms, for 0.1 us a mark.
constexpr uint64_t kTimedEvery = 32;
// How often a launch that waits for its stream's work in flight to fall within the window looks
// again (bound_wait).
constexpr long kBoundPollNs = 50 * 1000;

// One barrier's event and the launches of its span.
struct Mark {
  CUevent event = nullptr;  // behind the mark's barrier: the GPU got past it
  bool timed = false;       // `event` keeps a timestamp: a span starts there
  // a timed event before the barrier, put where the previous mark's `event` is timed (null
  // otherwise): the span to it is the launches' GPU time alone, without the time the barrier
  // held the stream
  CUevent before = nullptr;
  uint64_t launches = 0;
  bool gpu_was_busy = false;  // the previous mark had not completed when this one was put
  uint64_t seq = 0;           // its stream's count of marks before it
  int64_t recorded_ns = 0;    // when the gate's thread put it (0: put at a launch)
};

// Marks remembered per stream for that check (a mark retired before it is checked keeps its
// note until kNotes more marks were put).
constexpr size_t kNotes = 256;

// A stream as the gate knows it. A stream the program created is one in the process; the
// legacy default stream (null, CU_STREAM_LEGACY) is one per context, and a process that drives
// several GPUs launches on each device's under one handle; the per-thread default stream is one
// per context and thread. So their context (and thread) are part of the key.
struct StreamKey {
  CUcontext context = nullptr;  // null for a stream the program created
  CUstream stream = nullptr;
  uintptr_t thread = 0;  // the launching thread's, for the per-thread default stream
  bool operator==(const StreamKey& o) const {
    return context == o.context && stream == o.stream && thread == o.thread;
  }
};
struct StreamKeyHash {
  size_t operator()(const StreamKey& k) const {
    const std::hash<uintptr_t> h;
    return (h(reinterpret_cast<uintptr_t>(k.stream)) * 31 +
            h(reinterpret_cast<uintptr_t>(k.context))) * 31 + h(k.thread);
  }
};
// The key of `stream`, launched on by this thread with `context` current.
inline StreamKey stream_key(CUcontext context, CUstream stream) {
  if (stream == CU_STREAM_PER_THREAD) {
    return StreamKey{context, stream, static_cast<uintptr_t>(pthread_self())};
  }
  const bool legacy = stream == nullptr || stream == CU_STREAM_LEGACY;
  return StreamKey{legacy ? context : nullptr, stream, 0};
}

struct StreamState {
  CUcontext context = nullptr;
  uint64_t since_mark = 0;     // launches since the last mark
  uint64_t spacing = 8;        // launches between two marks, from the learned cost
  double ns_per_launch = 0.0;  // learned GPU time per launch (0 = not yet)
  bool dirty = false;          // launched since its last event (activity)
  std::deque<Mark> marks;      // marks not yet known to be complete, oldest first
  std::deque<Mark> asleep_marks;  // the barriers' events put while asleep, oldest first
  AsleepDrain drain;              // what its asleep barriers leave a request to wait for
  PacedDrain paced;               // ... and its paced ones
  int64_t asleep_next_ns = 0;     // its next asleep barrier, not before
  uint64_t asleep_count = 0;      // asleep marks put on it
  uint64_t next_seq = 0;            // the seq of its next mark
  std::array<BarrierNote, kNotes> notes{};  // by seq % kNotes
  uint64_t verified_from = 0;       // its first mark not yet complete at the last check
};

struct Gate : HoldState<Config> {
  std::atomic<bool> initialized{false};  // InitializeInjection ran
  std::atomic<bool> barriers_ok{true};  // a barrier failed: off for good
  std::atomic<bool> exiting{false};     // the process exits: no more driver calls
  std::atomic<bool> background_busy{false};  // the gate's thread is calling the driver
  int64_t quiet_since_ns = 0;  // the background thread's: when it saw all work completed
  std::atomic<int> captures{0};            // stream captures under way in the process
  std::atomic<bool> captures_counted{true};  // false for good once CUPTI went to a profiler
  std::atomic<int64_t> awake_until_ns{0};  // a backlog keeps the gate awake until then
  std::atomic<bool> per_thread{false};  // it launched on a per-thread default stream
  bool pacing_on = false;  // the gate may pace (GPREEMPT_DRIVER_PACED=1, read at cuInit)
  bool detach_on = true;   // it may let CUPTI go (not GPREEMPT_DRIVER_DETACH=0, read at cuInit)
  PacedTrials trials;      // when it may try pacing again (the gate's thread's)
  std::mutex mu;  // streams, events, capture starts
  std::unordered_map<StreamKey, StreamState, StreamKeyHash> streams;
  // events to use again, per context: an event can be recorded only on a stream of its own
  // device (a process may drive several GPUs)
  std::unordered_map<CUcontext, std::deque<CUevent>> spare_events;  // timed
  std::unordered_map<CUcontext, std::deque<CUevent>> spare_plain;   // untimed
  std::atomic<bool> batch_ok{true};  // cuStreamBatchMemOp puts a barrier's waits in one call
  std::atomic<bool> pair_ok{true};   // the driver takes 64-bit waits (Words::kPair)
  std::unordered_map<uintptr_t, CUdeviceptr> device_pages;
  std::atomic<uint64_t> devices{0};  // bit N: a context was made on physical GPU N
};

Gate& gate();

// The driver functions the gate calls, from the libcuda the process has loaded (the library is
// loaded by that driver; linking to it would need its development files where it is built).
// Each is looked up under the name cuda.h maps it to (cuEventDestroy -> cuEventDestroy_v2, ...).
#define GP_CU_FUNCTIONS(X) \
  X(cuCtxGetCurrent) X(cuCtxPopCurrent) X(cuCtxPushCurrent) X(cuDeviceGet) \
  X(cuDeviceGetCount) X(cuDevicePrimaryCtxGetState) X(cuEventCreate) X(cuEventDestroy) \
  X(cuEventElapsedTime) X(cuEventQuery) X(cuEventRecord) X(cuMemHostGetDevicePointer) \
  X(cuMemHostRegister) X(cuStreamBatchMemOp) X(cuStreamGetCtx) X(cuStreamIsCapturing) \
  X(cuStreamQuery) X(cuStreamWaitValue32) X(cuStreamWaitValue64) \
  X(cuThreadExchangeStreamCaptureMode)

struct CuApi {
#define GP_CU_MEMBER(name) decltype(&::name) name = nullptr;
  GP_CU_FUNCTIONS(GP_CU_MEMBER)
#undef GP_CU_MEMBER
};
// Null until cu_load() found every function.
const CuApi* cu();
bool cu_load();

void ring(Gate& g);
void publish_state(uint32_t state);
bool must_wait(Gate& g, uint32_t word, const WatchList* w);

// Set while the gate itself calls the driver: those calls are not launches of the program.
inline thread_local bool t_inside = false;
struct Guard {
  Guard() { t_inside = true; }
  ~Guard() { t_inside = false; }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
};

// Whether a stream capture may be under way (mu held: a capture's start waits for it); while
// none can be, a mark needs neither RelaxedCapture nor capturing(), three driver calls.
inline bool capture_possible(const Gate& g) {
  return g.captures.load(std::memory_order_relaxed) != 0 ||
         !g.captures_counted.load(std::memory_order_relaxed);
}

// Our calls must not disturb a graph another thread captures in global mode (`needed`: one may).
class RelaxedCapture {
 public:
  explicit RelaxedCapture(bool needed = true) : needed_(needed) { exchange(); }
  ~RelaxedCapture() { exchange(); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  void exchange() {
    if (needed_) {
      cu()->cuThreadExchangeStreamCaptureMode(&mode_);
    }
  }
  bool needed_;
  CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
};

// Makes `context` current for the calls in scope where the thread has another (or none).
class CurrentContext {
 public:
  explicit CurrentContext(CUcontext context) {
    CUcontext current = nullptr;
    if (context != nullptr && cu()->cuCtxGetCurrent(&current) == CUDA_SUCCESS && current != context &&
        cu()->cuCtxPushCurrent(context) == CUDA_SUCCESS) {
      pushed_ = true;
    }
  }
  ~CurrentContext() {
    if (pushed_) {
      CUcontext popped = nullptr;
      cu()->cuCtxPopCurrent(&popped);
    }
  }
  CurrentContext(const CurrentContext&) = delete;
  CurrentContext& operator=(const CurrentContext&) = delete;

 private:
  bool pushed_ = false;
};

// driver_contexts.cpp
// CUPTI's resource callback: a context made (its GPU into the block's devices word) or about
// to be destroyed (forget_context).
void on_context_call(Gate& g, CUpti_CallbackId cbid, const CUpti_ResourceData* data);
// The GPUs seen so far into the block, where there is one; rings where that adds one.
void publish_devices(Gate& g);
bool enable_context_callbacks(CUpti_SubscriberHandle subscriber);
// Detached from CUPTI: the GPUs whose primary context the process started, into the block; and
// every context forgotten (their streams and events), as no callback tells which go.
void look_for_devices(Gate& g);
void forget_contexts(Gate& g);

// driver_stranded.cpp: a watched task's block as the own channel holds it (driver_channel.cpp)
struct WatchedBlock {
  const uint8_t* view = nullptr;  // mapped read-only, never unmapped: the GPU may read it
  int fd = -1;                    // the daemon's read-only descriptor, kept to reopen it writable
  long pid = 0;                   // its owner, as the daemon named it (0: not named)
  int pidfd = -1;                 // of the owner, opened when the list came (-1: none)
};
// Watches the block behind `fd` (owner `pid`), taking the descriptor: false where it cannot be
// mapped, or this process could not clear its words should the owner exit while the daemon is
// gone (another user's block); the caller keeps `fd` then.
bool watch_block(int fd, long pid, WatchedBlock* out);
// Closes their descriptors (a list the daemon replaced).
void close_blocks(const std::vector<WatchedBlock>& blocks);
// The daemon is gone: a thread waits for each block's owner to exit and clears its activity
// words if they are still raised, then closes them all.
void free_stranded(std::vector<WatchedBlock> blocks);

// driver_hold.cpp
bool barriers_hold(Gate& g, const uint8_t* ctl);
void before_launch(CUpti_CallbackId cbid, const CUpti_CallbackData* data);
void after_launch(CUpti_CallbackId cbid, const CUpti_CallbackData* data);

// driver_marks.cpp
bool capturing(CUstream stream);
// Marks `stream` after a launch (mu held): a barrier where one holds, and an event; true where
// its work in flight then exceeds the window (the caller waits, bound_wait, once mu is let go).
bool mark(Gate& g, uint8_t* ctl, CUstream stream, StreamState& st);
// Waits until the stream's work in flight is within the window again (mu not held: the stream
// is looked up and its marks queried under mu every kBoundPollNs, the GIL let go throughout).
// A wait under mu held every other thread's launches, and the GIL on the way out: a deadlock
// where another thread held the GIL, or launched work that the awaited kernels wait for (a
// collective across the GPUs of one process).
void bound_wait(Gate& g, uint8_t* ctl, const StreamKey& key);
// Retires the stream's completed marks, learning the GPU time per launch from the spans the
// GPU ran back to back (the first mark still pending when the later was put) (mu held); every
// stream's, from the gate's thread at each look while awake (takes mu).
void reap(Gate& g, StreamState& st);
void reap_streams(Gate& g);
// Appends mark `m` to `line` (the stream's marks or asleep marks), numbered in one count with
// both, with its barrier's note (mu held).
void push_mark(StreamState& st, std::deque<Mark>& line, Mark m, const BarrierNote& note);
// The barrier on `stream` (mu held): waits on the GPU for this gate's word and the watched
// tasks' activity words; `note` (if given) says what its last wait is, and what its word read
// just before. False where it could not be put.
bool put_barrier(Gate& g, uint8_t* ctl, CUstream stream, BarrierNote* note = nullptr);
// An event of context `ctx`, which must be current, from the spares or new (mu held); null
// where none could be created.
CUevent take_event(Gate& g, CUcontext ctx, bool timed);
// Back to `ctx`'s spares (mu held); nothing for null.
void give_event(Gate& g, CUcontext ctx, CUevent e, bool timed);
// A retired mark's events (behind and before) back to `ctx`'s spares (mu held).
void give_mark(Gate& g, CUcontext ctx, const Mark& m);
// An event recorded on `stream` (of context `ctx`, current) now, timed or not (mu held); null
// where it could not be.
CUevent record_event(Gate& g, CUcontext ctx, CUstream stream, bool timed);
// An event recorded on `stream` (of context `ctx`, current) now, as the next of `marks`, timed
// or not (mu held): false where it could not be recorded.
bool record_mark(Gate& g, CUcontext ctx, CUstream stream, const std::deque<Mark>& marks,
                 Mark* out, bool timed);
// The GPU time (ms) from `first` to `second`: from a timed first mark's event to the timed
// event before the second's barrier (or to the second's own event, where that is timed and no
// event comes before its barrier); -1 where it cannot be told (mu held, both complete).
inline double span_ms(const Mark& first, const Mark& second) {
  const CUevent end = second.before != nullptr ? second.before
                      : second.timed          ? second.event
                                              : nullptr;
  float ms = 0.0f;
  if (!first.timed || end == nullptr ||
      cu()->cuEventElapsedTime(&ms, first.event, end) != CUDA_SUCCESS || ms < 0.0f) {
    return -1.0;
  }
  return ms;
}
// Retires `marks`' completed marks (of a stream of context `ctx`), oldest first, all but the
// last (mu held); `span(first, second)` sees each retired mark with the one after it, which
// the GPU has completed too (span_ms tells the GPU time between them).
template <class Span>
void retire_marks(Gate& g, CUcontext ctx, std::deque<Mark>& marks, Span span) {
  while (marks.size() > 1) {
    const Mark& first = marks[0];
    const Mark& second = marks[1];
    if (cu()->cuEventQuery(second.event) != CUDA_SUCCESS) {
      return;
    }
    span(first, second);
    give_mark(g, ctx, first);
    marks.pop_front();
  }
}
void forget_stream(CUstream stream);
// The program destroys `context` (cuCtxDestroy, cudaDeviceReset): its streams, their events and
// its spare events go, and the words' pages are registered again at the next barrier.
void forget_context(Gate& g, CUcontext context);
// Activity: auto_active drops once the process launched nothing for the grace time, its GPU
// work has completed, and the grace time has passed again since that was first seen: a kernel
// longer than the grace keeps it active for the grace after it completes, as the operator
// gate does; after short kernels it drops a grace after they completed. Called by the
// background thread; returns the ns until it would look again (INT64_MAX: nothing due).
int64_t check_idle(Gate& g, int64_t now);

// driver_asleep.cpp
// Called by the background thread while the callbacks are off: barriers on every known stream
// every kAsleepBarrierNs (kAsleepDenseBarrierNs on a backlogged one; paced, every barrier
// spacing), and the spans between them learned; true where a paced trial failed.
bool asleep_barriers(Gate& g, int64_t now, bool paced);
// Called by the background thread at each tick: at a hold's rise (HoldRise, barrier_check.h),
// one more barrier behind each stream's queued work, its word read raised as it is put, so that
// the GPU-side check dates the hold though the GPU may have reached the stream's last barrier
// before the thread looked (driver_verify.cpp).
void rise_barriers(Gate& g, int64_t now);
// Keeps the gate awake a moment now and then while barriers hold (kDiscoverNs).
void discover_streams(Gate& g, int64_t now);
// The gate switched: every stream's asleep marks join its marks, where their barriers are
// checked (verify_barriers) and retired, and its asleep spans are forgotten (takes mu). Whether
// pacing may start: no stream not yet judged has over kPacedStartMarks in flight (takes mu).
void end_asleep_marks(Gate& g);
bool may_start_pacing(Gate& g);
// The capture calls' callbacks, kept on while asleep: true where `cbid` is one (counted).
bool enable_capture_callbacks(CUpti_SubscriberHandle subscriber);
bool on_capture_call(Gate& g, CUpti_CallbackId cbid, const CUpti_CallbackData* data);

// driver_verify.cpp (its rule: barrier_check.h)
// Called by the background thread while the gate is awake: counts in barrier_leaks each look
// that finds this process's GPU work past a barrier whose last wait's word stayed raised from
// before the GPU reached the barrier. `on`: false while it is asleep or holds no barriers.
void verify_barriers(Gate& g, bool on);

// driver_channel.cpp
// A control block and a channel of the gate's own, for a process that has no Python client;
// false (and nothing changed) where the daemon cannot be reached.
bool open_own_channel(Gate& g);
Config config_from_environment();

}  // namespace gpreempt_driver
