// The in-process launch gate of gpreempt: a global RecordFunction callback that runs before
// every PyTorch operator of the process.
//
// Per operator (the fast path) it does a few atomic adds and plain loads: the process's launch
// counter, the estimated work in flight, the operator's cost slot (found by a hash of its name),
// the control block's gate_closed word, the activity flag and, where the daemon sent some, the
// activity words of the tasks that outrank this one (a read-only view of their control blocks:
// the gate stops by itself while one of them is active). No syscall, no lock.
// Everything else happens on rare slow paths:
//   * the gate is closed: wait (spin briefly, then sleep on the word, woken by the daemon or
//     the next poll) until the daemon opens it;
//   * every `record_every` launches, or every half window of estimated GPU time: record a CUDA
//     event on the current stream, retire completed events (learning the average GPU time per
//     launch from their timestamps), and if the work in flight exceeds the window, wait for the
//     oldest event;
//   * now and then, an operator is timed on its own: an event before it and one when it ends
//     or the next operator (a nested one included) begins, whichever comes first. Each operator
//     adds its own learned GPU time to the work in flight, so a few long ones (an optimizer's
//     _foreach_ updates over every parameter) cannot fill the GPU for milliseconds behind a
//     window that counts them at the average cost;
//   * the first launch after idling: publish auto_active=1 and ring the doorbell; a background
//     thread publishes auto_active=0 once the process's GPU work has completed plus a grace time;
//   * with stream barriers (opt-in): every `barrier_ms` of estimated GPU time, put waits on the
//     current stream for the gate's own word and the watched tasks' activity words (CUDA
//     stream memory operations, or hipStreamWaitValue32 on a ROCm build, on the registered
//     control blocks). The GPU then stops this
//     process's queued work at the next barrier the moment a watched task becomes active, and
//     goes on the moment it ends, with no CPU in between; the CPU no longer stops for a watched
//     task and keeps launching ahead, up to the open window.
//   * asleep: while the daemon says that nobody more important on the GPU has been active for a
//     while (sleep_ok), the gate is closed by no one and no watched task is active, a bound
//     gate disables its callback, so that operators cost nothing at all; a thread wakes it
//     (re-enables the callback) the moment that changes. An unbounded gate (a task that
//     preempts others) sleeps the same way once its process uses request() (hinted), whose
//     requests then say when it is active instead of its launches.
//
// Device work goes through c10's device-generic DeviceGuardImplInterface (CUDA and ROCm builds
// register theirs under DeviceType::CUDA), so this file needs no CUDA headers and builds
// against any PyTorch, CPU-only included. With a CPU-only PyTorch the gate still counts launches
// and honours gate_closed; it records no events.

#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "hip_api.h"

#include <ATen/record_function.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GATE_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define GATE_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define GATE_CPU_RELAX() \
  do {                   \
  } while (0)
#endif

namespace py = pybind11;

namespace {

// Control block offsets (see gpreempt/control.py).
constexpr size_t kOffGateClosed = 0;
constexpr size_t kOffGeneration = 4;
constexpr size_t kOffRequests = 8;
constexpr size_t kOffAutoActive = 12;
constexpr size_t kOffLaunches = 16;
constexpr size_t kOffWaits = 24;
constexpr size_t kOffWaitNs = 32;
constexpr size_t kOffWindow = 40;
constexpr size_t kOffInstalled = 44;
constexpr size_t kOffHinted = 48;
constexpr size_t kOffWindowShareUs = 52;
constexpr size_t kOffSleepOk = 56;
constexpr size_t kOffBarriersOn = 60;

// How often the sleep thread looks at the words: often while asleep (until it wakes, what the
// process launches after a more important task starts is held only by the thread's barriers,
// or not at all without barriers), rarely while awake.
constexpr int64_t kAsleepPollNs = 200 * 1000;
constexpr int64_t kAwakePollNs = 10 * 1000 * 1000;
// Asleep with stream barriers (see asleep_barrier): the expected wait of a starting request
// is taken over about this many of the last spans between two barriers.
constexpr double kAsleepDrainSpans = 50.0;

// The control blocks of the tasks that outrank this one, mapped read-only (set by the session
// from the daemon's watch list). A list is never changed once published.
constexpr size_t kMaxWatched = 8;
struct WatchList {
  size_t n = 0;
  const uint8_t* blocks[kMaxWatched] = {};
  uint32_t version = 0;  // the daemon's version of this list; 0 = incomplete, never matches
};

// gate_closed of a plain closed gate (odd); 2V (V >= 1): closed only while the tasks of watch
// list V are active (gpreempt.control.closed_while_watched). A stream barrier waits for bit 0.
constexpr uint32_t kClosed = 1;

enum Mode : int { kAdaptive = 0, kTight = 1, kOpen = 2 };

// Feature detection: newer PyTorch versions add these to the generic device interface.
template <class T, class = void>
struct HasIsStreamCapturing : std::false_type {};
template <class T>
struct HasIsStreamCapturing<T,
                            std::void_t<decltype(std::declval<const T&>().isStreamCapturing(
                                std::declval<const c10::Stream&>()))>> : std::true_type {};

template <class T, class = void>
struct HasElapsedTime : std::false_type {};
template <class T>
struct HasElapsedTime<T, std::void_t<decltype(std::declval<const T&>().elapsedTime(
                             std::declval<void*>(), std::declval<void*>(),
                             std::declval<c10::DeviceIndex>()))>> : std::true_type {};

template <class T>
bool stream_capturing(const T* impl, const c10::Stream& stream) {
  if constexpr (HasIsStreamCapturing<T>::value) {
    return impl->isStreamCapturing(stream);
  } else {
    return false;  // the Python side counts captures begun through torch.cuda.CUDAGraph
  }
}

template <class T>
double elapsed_ms(const T* impl, void* first, void* second, c10::DeviceIndex device) {
  if constexpr (HasElapsedTime<T>::value) {
    return impl->elapsedTime(first, second, device);
  } else {
    return -1.0;
  }
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void sleep_ns(int64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  nanosleep(&ts, nullptr);
}

// Sleeps up to `ns` while the word still holds `seen`. The daemon wakes the word's waiters
// (FUTEX_WAKE) right after it opens a gate, so a waiting task resumes at once rather than at
// its next poll; words nobody wakes (the in-process scheduler's) are simply polled.
inline void wait_word(const uint32_t* word, uint32_t seen, int64_t ns) {
#if defined(__linux__) && defined(SYS_futex)
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, nullptr, 0);  // EAGAIN, EINTR: look again
#else
  (void)word;
  (void)seen;
  sleep_ns(ns);
#endif
}

// Releases the GIL for a blocking wait if this thread holds it, and takes it back at the end of
// the scope. Most operators called from Python already run without the GIL; a few do not, and
// blocking them with the GIL held would stop every other Python thread of the process,
// including one that might be about to open the gate.
class MaybeNoGil {
 public:
  MaybeNoGil() = default;
  MaybeNoGil(const MaybeNoGil&) = delete;
  MaybeNoGil& operator=(const MaybeNoGil&) = delete;
  void release() {
    if (state_ == nullptr && Py_IsInitialized() && PyGILState_Check()) {
      state_ = PyEval_SaveThread();
    }
  }
  ~MaybeNoGil() {
    if (state_ != nullptr) {
      PyEval_RestoreThread(state_);
    }
  }

 private:
  PyThreadState* state_ = nullptr;
};

// The gate's settings: the fields of the Python GateConfig (gpreempt/client/gate/config.py),
// which names them and owns their defaults, read by name as the gate is installed
// (config_from). The same names here.
struct Config {
  bool bound;
  bool auto_activity;
  uint64_t record_every;          // launches per event while the window is tight
  uint64_t open_record_every;     // launches per event while it is open
  uint64_t window_launches;       // launches in flight at most while tight
  uint64_t open_window_launches;  // ... while open
  double window_ms;               // estimated GPU time in flight at most while tight (<=0: off)
  double open_window_ms;          // ... while open
  double tight_hold_ms;           // stay tight this long after the gate was last closed
  int mode;                       // kAdaptive, kTight or kOpen
  double idle_grace_ms;           // quiet time before auto_active drops back to 0
  double poll_us;                 // sleep per poll of a closed gate
  bool op_costs;                  // count each operator at its own timed cost
  double asleep_barrier_ms;       // asleep: wall time between two barriers of the sleep thread
  double asleep_max_drain_ms;     // ... the expected wait of a starting request that wakes it
  double backlog_hold_s;          // ... how long it then stays awake
};

// The learned GPU time of one operator (by name). The table is filled as names are first seen
// and never shrinks; a full table leaves further names at the average cost.
constexpr size_t kCostSlots = 1024;
constexpr size_t kCostProbes = 8;
constexpr size_t kCostNameLen = 64;
struct OpCost {
  std::atomic<uint64_t> key{0};      // hash of the name, 0 = free slot
  std::atomic<uint32_t> ns{0};       // learned GPU time per call, 0 = not learned yet
  std::atomic<uint32_t> calls{0};
  std::atomic<uint32_t> samples{0};  // exact timings so far
  std::atomic<uint32_t> bounds{0};   // timings that are only upper bounds
  std::atomic<bool> named{false};
  char name[kCostNameLen] = {};
};

// A timing of one operator: `before` was recorded just before it launched, `after` as it ended
// or the next operator began. `exact`: the GPU had not reached `before` yet when `after` was
// recorded, so the operator's kernels ran back to back between them and their distance is its
// own GPU time. Otherwise the GPU may have idled while the CPU launched them, and the distance
// is only an upper bound (by a kernel launch's latency, for most operators).
struct Sample {
  void* before;
  void* after;
  OpCost* op;
  c10::DeviceIndex device;
  bool exact;
};

struct Pending {
  void* event;
  uint64_t begin;       // launch count when the previous event was recorded
  uint64_t mark;        // launch count when this one was
  uint64_t begin_work;  // estimated work (ns) launched when the previous event was recorded
  uint64_t mark_work;   // ... when this one was
  c10::Stream stream;
  // The previous event was still pending when this one was recorded: the GPU had work queued
  // on the stream all through this segment, so the time between the two is GPU time. A segment
  // during which the stream ran dry (the gate was closed, the CPU was slow) measures idle time
  // too and teaches nothing about the cost of a launch.
  bool backlogged;
};

// A barrier the sleep thread put while asleep: the event recorded behind it, when it was
// recorded (steady clock), and whether the GPU had not yet reached the one before by then.
struct AsleepMark {
  void* event;
  c10::Stream stream;
  int64_t recorded_ns;
  bool backlogged;
};

struct KnownStream {
  c10::Stream stream;
  void* tail = nullptr;  // reusable event for drain and idle detection
};

struct GateState {
  Config cfg;
  uint8_t* ctl = nullptr;
  int doorbell = -1;
  const c10::impl::DeviceGuardImplInterface* impl = nullptr;  // CUDA/ROCm, or null

  std::atomic<bool> uninstalled{false};
  std::atomic<bool> device_live{false};
  std::atomic<int> captures{0};
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> launches{0};
  std::atomic<uint64_t> next_mark{0};
  std::atomic<uint64_t> work_ns{0};  // estimated GPU time of everything launched so far
  std::atomic<uint64_t> next_work_mark{std::numeric_limits<uint64_t>::max()};
  // learned GPU time per launch (0 = unknown), the cost of operators not timed yet; written
  // under mu, read by the per-launch path
  std::atomic<double> ns_per_launch{0.0};
  std::atomic<bool> sample_open{false};
  std::atomic<uint64_t> samples_dropped{0};
  OpCost costs[kCostSlots];
  std::atomic<uint64_t> waits{0};
  std::atomic<uint64_t> wait_ns{0};
  std::atomic<uint64_t> bound_waits{0};
  std::atomic<uint64_t> bound_wait_ns{0};
  std::atomic<uint64_t> events_recorded{0};
  std::atomic<uint32_t> active{0};
  std::atomic<uint64_t> activations{0};
  std::atomic<int64_t> last_closed_ns{std::numeric_limits<int64_t>::min() / 2};
  std::atomic<uint32_t> window{0};
  std::atomic<bool> tight_now{false};
  std::atomic<const WatchList*> watch{nullptr};
  uint32_t seen_generation = 0;  // guarded by mu
  // stream barriers: on while `barrier_ns` > 0 and nothing failed; the next one is due once the
  // estimated work launched reaches next_barrier_work (never while they are off: the per-launch
  // path compares only that)
  std::atomic<bool> barriers{false};
  bool hip = false;  // barriers through the HIP runtime (a ROCm build), else libcuda; under mu
  uint64_t barrier_ns = 0;
  std::atomic<uint64_t> next_barrier_work{std::numeric_limits<uint64_t>::max()};
  std::atomic<uint64_t> barriers_put{0};
  // HIP barriers that waited for the gate to open fully, a watched block's page being one HIP
  // cannot map (see put_hip_waits)
  std::atomic<uint64_t> barrier_fallbacks{0};
  // asleep: the operator callback is disabled (bound gates only; see sleep_loop)
  std::atomic<bool> asleep{false};
  std::atomic<uint64_t> sleeps{0};
  std::thread sleeper;
  // asleep with barriers: barriers the sleep thread put, wakes because the GPU fell behind,
  // and until when the gate stays awake after one
  std::atomic<uint64_t> asleep_barriers{0};
  std::atomic<uint64_t> backlog_wakes{0};
  std::atomic<double> asleep_drain_ms{0.0};    // the last estimate (see asleep_barrier)
  std::atomic<double> asleep_longest_ms{0.0};  // the longest span seen
  std::atomic<int64_t> awake_until_ns{std::numeric_limits<int64_t>::min()};

  std::mutex mu;  // guards everything below, and all event calls
  std::deque<Pending> fifo;
  std::vector<std::pair<c10::DeviceIndex, void*>> free_events;
  bool have_done = false;
  Pending done{nullptr, 0, 0, 0, 0, c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::kCPU))};
  double window_ns = 0.0;      // the bound on estimated work in flight, last computed
  // the operator being timed: its `before` event and stream (sample_open says there is one)
  void* sample_before = nullptr;
  OpCost* sample_op = nullptr;
  c10::Stream sample_stream{c10::Stream::DEFAULT, c10::Device(c10::kCPU)};
  std::atomic<pthread_t> sample_thread{};  // the thread that launches the operator being timed
  std::deque<Sample> samples;  // timings waiting for their `after` event
  std::vector<KnownStream> streams;
  // the stream of the last segment (the one the process last launched on, as far as the gate
  // saw), the barriers the sleep thread put on it that the GPU has not reached yet, oldest
  // first, and the last one it reached (event null: none)
  c10::Stream last_stream{c10::Stream::DEFAULT, c10::Device(c10::kCPU)};
  std::deque<AsleepMark> asleep_marks;
  AsleepMark asleep_reached{nullptr, c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::kCPU)),
                            0, false};
  double span_sum = 0.0;     // decaying sums of the spans' GPU times (ms) and their squares
  double span_square = 0.0;
  int64_t next_asleep_barrier_ns = 0;
  std::string error;
  std::unordered_map<uintptr_t, uint64_t> device_pages;  // host page -> its device address

  std::mutex publish_mu;
  std::mutex bg_mu;
  std::condition_variable bg_cv;
  bool bg_stop = false;
  std::thread bg;
};

std::atomic<GateState*> g_gate{nullptr};
std::atomic<bool> g_in_child{false};

// In-process task gates (gpreempt.GPUScheduler): a thread bound to a task waits while its
// task's word is nonzero; threads bound to no task (PyTorch's autograd workers among them)
// follow the default word, if the scheduler set one. Unbounded threads (tasks that are never
// preempted in-process) keep out of the in-flight window.
thread_local const uint32_t* tls_task_word = nullptr;
thread_local bool tls_task_unbounded = false;
std::atomic<const uint32_t*> g_default_task_word{nullptr};
// Set once a scheduler binds a thread or a default word: until then the per-launch path reads
// no thread-local state (a TLS access from a loaded extension is a function call).
std::atomic<bool> g_task_gates{false};
at::CallbackHandle g_handle = 0;
bool g_atfork_registered = false;

// --- control block access: plain atomic loads and stores on the shared mapping -------------
inline uint32_t load32(const uint8_t* base, size_t off) {
  return __atomic_load_n(reinterpret_cast<const uint32_t*>(base + off), __ATOMIC_RELAXED);
}
inline void store32(uint8_t* base, size_t off, uint32_t v) {
  __atomic_store_n(reinterpret_cast<uint32_t*>(base + off), v, __ATOMIC_RELAXED);
}
inline void store64(uint8_t* base, size_t off, uint64_t v) {
  __atomic_store_n(reinterpret_cast<uint64_t*>(base + off), v, __ATOMIC_RELAXED);
}

// Whether a watched task wants the GPU: the rule of gpreempt.control.wants_gpu (explicit
// requests win over automatic activity once the task has used request()).
inline bool watched_active(const WatchList* w) {
  if (w == nullptr) {
    return false;
  }
  for (size_t i = 0; i < w->n; ++i) {
    const uint8_t* b = w->blocks[i];
    if (load32(b, kOffRequests) != 0 ||
        (load32(b, kOffAutoActive) != 0 && load32(b, kOffHinted) == 0)) {
      return true;
    }
  }
  return false;
}

// Whether a gate whose gate_closed reads `word` must wait, given its watch list `w`: the rule of
// gpreempt.control.released_by_watch. A gate the daemon closed only while the tasks of watch
// list V are active (word 2V), and that watches exactly list V, waits only while one is.
inline bool closed_while_watched(uint32_t word, const WatchList* w) {
  return word != 0 && (word & 1u) == 0 && w != nullptr && w->version != 0 &&
         word / 2 == w->version;
}
// Whether stream barriers hold this task's work on the GPU: they are on, and the daemon gives
// the task an in-flight share (someone more important is registered on its GPU).
inline bool barriers_hold(const GateState* g) {
  return g->barriers.load(std::memory_order_relaxed) && load32(g->ctl, kOffWindowShareUs) != 0;
}
// With stream barriers the GPU stops for the watched tasks by itself; the CPU does not.
inline bool must_wait(const GateState* g, uint32_t word, const WatchList* w) {
  if (word == 0 || closed_while_watched(word, w)) {
    return watched_active(w) && !barriers_hold(g);
  }
  return true;
}

void ring(GateState* g) {
  if (g->doorbell < 0) {
    return;
  }
  uint64_t one = 1;
  ssize_t ignored = write(g->doorbell, &one, sizeof(one));  // EAGAIN: it is ringing already
  (void)ignored;
}

// Writes the activity flag as it is now; whoever changed it last publishes last.
void publish_activity(GateState* g) {
  std::lock_guard<std::mutex> lock(g->publish_mu);
  store32(g->ctl, kOffAutoActive, g->active.load());
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

// --- per-operator cost ----------------------------------------------------------------------------
// The name's hash (FNV-1a), never 0. Names are hashed by content: an operator's name pointer is
// stable, but a scope named by a string owns its copy and the address is reused.
inline uint64_t name_key(const char* name) {
  uint64_t h = 1469598103934665603ull;
  for (const char* c = name; *c != '\0'; ++c) {
    h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  }
  return h == 0 ? 1 : h;
}

// The name's slot, claimed on first sight; null if the table has no room near its hash.
OpCost* find_cost(GateState* g, const char* name) {
  const uint64_t key = name_key(name);
  size_t i = static_cast<size_t>(key) & (kCostSlots - 1);
  for (size_t probe = 0; probe < kCostProbes; ++probe, i = (i + 1) & (kCostSlots - 1)) {
    OpCost& slot = g->costs[i];
    uint64_t seen = slot.key.load(std::memory_order_acquire);
    if (seen == key) {
      return &slot;
    }
    if (seen == 0) {
      if (slot.key.compare_exchange_strong(seen, key, std::memory_order_acq_rel)) {
        std::strncpy(slot.name, name, kCostNameLen - 1);
        slot.named.store(true, std::memory_order_release);
        return &slot;
      }
      if (seen == key) {
        return &slot;
      }
    }
  }
  return nullptr;
}

// Whether to time this call of the operator: the first calls until four exact timings came,
// then one call in 256 (costs drift little).
inline bool sample_due(OpCost* op) {
  const uint32_t calls = op->calls.fetch_add(1, std::memory_order_relaxed) + 1;
  return (calls <= 64 && op->samples.load(std::memory_order_relaxed) < 4) || (calls & 255) == 0;
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
  std::unique_lock<std::mutex> lock(g->mu, std::defer_lock);
  if (!lock.try_lock()) {
    nogil.release();
    lock.lock();
  }
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

// --- slow paths -------------------------------------------------------------------------------
// How long a thread sleeps at a gate the daemon closed: the daemon wakes it as it opens the gate
// (a futex), so this only paces the retiring of completed events; short sleeps would cost a
// peer that waits for its turn a core's worth of wake-ups.
constexpr int64_t kClosedSleepNs = 1000000;

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
  std::unique_lock<std::mutex> lock(g->mu, std::defer_lock);
  if (!lock.try_lock()) {
    nogil.release();
    lock.lock();
  }
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

// --- stream barriers ------------------------------------------------------------------------------
// The driver's stream memory operations, looked up in the libcuda the process already loaded
// (declared here: this file builds without CUDA headers). Absent on ROCm and CPU-only builds.
using CuResult = int;
using CuDevicePtr = unsigned long long;
constexpr unsigned kWaitEq = 1;              // CU_STREAM_WAIT_VALUE_EQ
constexpr unsigned kWaitNor = 3;             // CU_STREAM_WAIT_VALUE_NOR
constexpr unsigned kRegisterPortable = 1;    // CU_MEMHOSTREGISTER_PORTABLE (every context)
constexpr unsigned kRegisterDeviceMap = 2;   // CU_MEMHOSTREGISTER_DEVICEMAP
constexpr unsigned kRegisterReadOnly = 8;    // CU_MEMHOSTREGISTER_READ_ONLY
constexpr CuResult kAlreadyRegistered = 712;  // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
constexpr uintptr_t kPage = 4096;

struct CuApi {
  CuResult (*wait32)(void*, CuDevicePtr, uint32_t, unsigned) = nullptr;
  CuResult (*host_register)(void*, size_t, unsigned) = nullptr;
  CuResult (*device_pointer)(CuDevicePtr*, void*, unsigned) = nullptr;
  // a thread that has not yet called CUDA (an operator's first, on a new thread) has no
  // current context; the barrier then borrows the device's primary one, PyTorch's own
  CuResult (*ctx_get_current)(void**) = nullptr;
  CuResult (*device_get)(int*, int) = nullptr;
  CuResult (*primary_ctx_retain)(void**, int) = nullptr;
  CuResult (*ctx_push)(void*) = nullptr;
  CuResult (*ctx_pop)(void**) = nullptr;
};

template <class F>
F cu_symbol(void* lib, const char* versioned, const char* plain) {
  void* f = dlsym(lib, versioned);
  return reinterpret_cast<F>(f != nullptr ? f : dlsym(lib, plain));
}
template <class F>
F cu_symbol(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

const CuApi* cu_api() {
  static const CuApi* api = []() -> const CuApi* {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);  // absent: no NVIDIA driver
    if (lib == nullptr) {
      return nullptr;
    }
    auto* a = new CuApi();
    a->wait32 = cu_symbol<decltype(a->wait32)>(lib, "cuStreamWaitValue32_v2", "cuStreamWaitValue32");
    a->host_register =
        cu_symbol<decltype(a->host_register)>(lib, "cuMemHostRegister_v2", "cuMemHostRegister");
    a->device_pointer = cu_symbol<decltype(a->device_pointer)>(
        lib, "cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer");
    a->ctx_get_current = cu_symbol<decltype(a->ctx_get_current)>(lib, "cuCtxGetCurrent");
    a->device_get = cu_symbol<decltype(a->device_get)>(lib, "cuDeviceGet");
    a->primary_ctx_retain =
        cu_symbol<decltype(a->primary_ctx_retain)>(lib, "cuDevicePrimaryCtxRetain");
    a->ctx_push = cu_symbol<decltype(a->ctx_push)>(lib, "cuCtxPushCurrent_v2", "cuCtxPushCurrent");
    a->ctx_pop = cu_symbol<decltype(a->ctx_pop)>(lib, "cuCtxPopCurrent_v2", "cuCtxPopCurrent");
    if (a->wait32 == nullptr || a->host_register == nullptr || a->device_pointer == nullptr ||
        a->ctx_get_current == nullptr || a->device_get == nullptr ||
        a->primary_ctx_retain == nullptr || a->ctx_push == nullptr || a->ctx_pop == nullptr) {
      return nullptr;
    }
    return a;
  }();
  return api;
}

// Makes the device's primary context current for the barrier's driver calls on a thread that
// has none, and takes it off again after them (mu held).
class BorrowedContext {
 public:
  BorrowedContext(const CuApi* cu, int device) : cu_(cu) {
    void* current = nullptr;
    if (cu->ctx_get_current(&current) == 0 && current != nullptr) {
      return;
    }
    // retained once per device and kept: PyTorch holds it for the life of the process anyway
    static std::unordered_map<int, void*> primaries;
    void*& primary = primaries[device];
    if (primary == nullptr) {
      int handle = 0;
      check(cu->device_get(&handle, device), "cuDeviceGet");
      check(cu->primary_ctx_retain(&primary, handle), "cuDevicePrimaryCtxRetain");
    }
    check(cu->ctx_push(primary), "cuCtxPushCurrent");
    pushed_ = true;
  }
  ~BorrowedContext() {
    if (pushed_) {
      void* popped = nullptr;
      cu_->ctx_pop(&popped);
    }
  }
  BorrowedContext(const BorrowedContext&) = delete;
  BorrowedContext& operator=(const BorrowedContext&) = delete;

 private:
  static void check(CuResult r, const char* what) {
    if (r != 0) {
      throw std::runtime_error(std::string(what) + " failed (driver error " + std::to_string(r) +
                               ")");
    }
  }
  const CuApi* cu_;
  bool pushed_ = false;
};

// The device address of a word of a control block (mu held): its page is registered with the
// driver once and stays registered, so a barrier already queued never reads an unregistered
// page. The session never unmaps a watched block while the gate puts barriers, so an address
// seen here always names the same block.
CuDevicePtr device_word(GateState* g, const CuApi* cu, const uint8_t* word, bool read_only) {
  const uintptr_t page = reinterpret_cast<uintptr_t>(word) & ~(kPage - 1);
  auto it = g->device_pages.find(page);
  if (it == g->device_pages.end()) {
    void* host = reinterpret_cast<void*>(page);
    const unsigned flags =
        kRegisterPortable | kRegisterDeviceMap | (read_only ? kRegisterReadOnly : 0);
    const CuResult r = cu->host_register(host, kPage, flags);
    CuDevicePtr device = 0;
    if ((r != 0 && r != kAlreadyRegistered) || cu->device_pointer(&device, host, 0) != 0) {
      throw std::runtime_error("cannot map a control block for the GPU (driver error " +
                               std::to_string(r) + ")");
    }
    it = g->device_pages.emplace(page, device).first;
  }
  return it->second + (reinterpret_cast<uintptr_t>(word) - page);
}

// --- stream barriers through HIP (ROCm builds of PyTorch) --------------------------------------
// The same waits on the same words as the CUDA path below, through the HIP runtime's
// hipStreamWaitValue32 (see hip_api.h). HIP has no current-context rule to satisfy: a stream
// carries its device.
struct HipApi {
  gpreempt_hip::WaitValue32 wait32 = nullptr;
  gpreempt_hip::HostRegister host_register = nullptr;
  gpreempt_hip::HostGetDevicePointer device_pointer = nullptr;
  gpreempt_hip::GetDevice get_device = nullptr;
  gpreempt_hip::DeviceGetAttribute device_attribute = nullptr;
};

// The API from one library (a handle from dlopen), or null if a function is missing.
const HipApi* hip_api_from(void* lib) {
  if (lib == nullptr) {
    return nullptr;
  }
  auto* a = new HipApi();  // kept for the life of the process, like the library
  a->wait32 = reinterpret_cast<gpreempt_hip::WaitValue32>(dlsym(lib, gpreempt_hip::kWaitValue32Name));
  a->host_register =
      reinterpret_cast<gpreempt_hip::HostRegister>(dlsym(lib, gpreempt_hip::kHostRegisterName));
  a->device_pointer = reinterpret_cast<gpreempt_hip::HostGetDevicePointer>(
      dlsym(lib, gpreempt_hip::kHostGetDevicePointerName));
  a->get_device =
      reinterpret_cast<gpreempt_hip::GetDevice>(dlsym(lib, gpreempt_hip::kGetDeviceName));
  a->device_attribute = reinterpret_cast<gpreempt_hip::DeviceGetAttribute>(
      dlsym(lib, gpreempt_hip::kDeviceGetAttributeName));
  if (a->wait32 == nullptr || a->host_register == nullptr || a->device_pointer == nullptr ||
      a->get_device == nullptr || a->device_attribute == nullptr) {
    delete a;
    return nullptr;
  }
  return a;
}

// The HIP runtime PyTorch loaded (never a second copy if one is loaded already); null without.
const HipApi* hip_api() {
  static const HipApi* api = []() -> const HipApi* {
    for (const char* name : gpreempt_hip::kLibraries) {
      if (void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
        return hip_api_from(lib);
      }
    }
    for (const char* name : gpreempt_hip::kLibraries) {
      if (void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
        return hip_api_from(lib);
      }
    }
    return nullptr;
  }();
  return api;
}

// Whether the current device runs hipStreamWaitValue32, as HIP says to ask it
// (hipDeviceAttributeCanUseStreamWaitValue); `why` says why not.
bool hip_waits_supported(const HipApi* hip, std::string* why) {
  int device = 0;
  int value = 0;
  gpreempt_hip::Result r = hip->get_device(&device);
  if (r == 0) {
    r = hip->device_attribute(&value, gpreempt_hip::kAttrCanUseStreamWaitValue, device);
  }
  if (r != 0) {
    *why = "hipDeviceGetAttribute(hipDeviceAttributeCanUseStreamWaitValue) failed (HIP error " +
           std::to_string(r) + "): this HIP runtime cannot say whether it runs stream waits";
    return false;
  }
  if (value == 0) {
    *why = "device " + std::to_string(device) +
           " cannot run hipStreamWaitValue32 (hipDeviceAttributeCanUseStreamWaitValue is 0)";
    return false;
  }
  return true;
}

// The device address of a control block word for HIP (mu held), or null where HIP cannot map
// its page: the page is registered once (mapped, portable) and stays registered, as on the
// CUDA path, and a refusal is remembered (address 0) so that it is not asked again. HIP pins
// the page for writing, so the page of a watched block, mapped read-only, is refused.
void* hip_device_word(GateState* g, const HipApi* hip, const uint8_t* word) {
  const uintptr_t page = reinterpret_cast<uintptr_t>(word) & ~(kPage - 1);
  auto it = g->device_pages.find(page);
  if (it == g->device_pages.end()) {
    void* host = reinterpret_cast<void*>(page);
    const gpreempt_hip::Result r = hip->host_register(
        host, kPage, gpreempt_hip::kRegisterPortable | gpreempt_hip::kRegisterMapped);
    void* device = nullptr;
    if ((r != 0 && r != gpreempt_hip::kAlreadyRegistered) ||
        hip->device_pointer(&device, host, 0) != 0) {
      device = nullptr;
    }
    it = g->device_pages.emplace(page, reinterpret_cast<uintptr_t>(device)).first;
  }
  if (it->second == 0) {
    return nullptr;
  }
  return reinterpret_cast<void*>(it->second + (reinterpret_cast<uintptr_t>(word) - page));
}

// Queues the barrier's waits on `stream` (a hipStream_t; mu held): the gate's own word with
// bit 0 clear (on a complete watch list) or zero, then each watched task's activity words at
// zero. The CUDA path waits for bit 0 with WAIT_VALUE_NOR; here an equality under the mask
// 0x1 says the same, without relying on HIP's NOR.
//
// Where HIP cannot map a watched block's page (read-only, see hip_device_word), the GPU cannot
// read that task's activity: the barrier then waits for the own word at zero alone, i.e. for
// the daemon to open the gate, which holds the GPU through the whole suspension rather than
// only while the watched tasks are active, and the daemon's latency replaces the GPU's. Each
// such barrier is counted (stats: barrier_fallbacks), and the first one said on stderr.
void put_hip_waits(GateState* g, const HipApi* hip, void* stream) {
  auto wait = [&](void* address, uint32_t mask) {
    const gpreempt_hip::Result r = hip->wait32(stream, address, 0, gpreempt_hip::kWaitEq, mask);
    if (r == gpreempt_hip::kErrorInvalidValue) {
      throw std::runtime_error(
          "hipStreamWaitValue32 refused the control block (hipErrorInvalidValue): this HIP "
          "runtime waits only on memory from hipMallocSignalMemory (GPU_STREAMOPS_CP_WAIT set, "
          "or an older CLR)");
    }
    if (r != 0) {
      throw std::runtime_error("hipStreamWaitValue32 failed (HIP error " + std::to_string(r) +
                               ")");
    }
  };
  const WatchList* list = g->watch.load(std::memory_order_acquire);
  const uint8_t* own = g->ctl + kOffGateClosed;
  const bool complete = list != nullptr && list->version != 0;
  void* own_word = hip_device_word(g, hip, own);
  if (own_word == nullptr) {
    throw std::runtime_error("HIP cannot map this process's control block for the GPU "
                             "(hipHostRegister refused its page)");
  }
  std::vector<void*> watched;
  bool unreadable = false;
  for (size_t i = 0; list != nullptr && i < list->n && !unreadable; ++i) {
    const uint8_t* b = list->blocks[i];
    watched.push_back(hip_device_word(g, hip, b + kOffRequests));
    if (load32(b, kOffHinted) == 0) {  // its automatic activity counts too (wants_gpu)
      watched.push_back(hip_device_word(g, hip, b + kOffAutoActive));
    }
    unreadable = watched.back() == nullptr;  // both words lie on the block's one page
  }
  if (unreadable) {
    if (g->barrier_fallbacks.fetch_add(1, std::memory_order_relaxed) == 0) {
      std::fprintf(stderr,
                   "gpreempt: HIP cannot map a watched task's control block (read-only) for the "
                   "GPU: stream barriers wait for the daemon to open the gate instead\n");
    }
    wait(own_word, gpreempt_hip::kAllBits);
    return;
  }
  wait(own_word, complete ? kClosed : gpreempt_hip::kAllBits);
  for (void* address : watched) {
    wait(address, gpreempt_hip::kAllBits);
  }
}

// Queues one barrier's waits on `stream` (mu held): the GPU goes past it only while the gate
// is not plainly closed (bit 0 of gate_closed) and no watched task is active. False if the
// stream is being captured (a barrier inside a graph would wait at every replay). Throws if
// the driver refuses.
bool put_waits(GateState* g, const c10::Stream& stream) {
  if (stream_capturing(g->impl, stream)) {
    return false;
  }
  if (g->hip) {
    const HipApi* hip = hip_api();
    if (hip == nullptr) {
      throw std::runtime_error("the HIP runtime offers no hipStreamWaitValue32");
    }
    put_hip_waits(g, hip, stream.native_handle());
    g->barriers_put.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  const CuApi* cu = cu_api();
  if (cu == nullptr) {
    throw std::runtime_error("the CUDA driver offers no stream memory operations");
  }
  const BorrowedContext context(cu, stream.device_index());
  void* handle = stream.native_handle();
  auto wait = [&](CuDevicePtr address, uint32_t value, unsigned how) {
    const CuResult r = cu->wait32(handle, address, value, how);
    if (r != 0) {
      throw std::runtime_error("cuStreamWaitValue32 failed (driver error " + std::to_string(r) +
                               ")");
    }
  };
  // The GPU goes past a closed-while-watched word (2V) only where the CPU would: on a
  // complete list, whose tasks the waits below watch. On an incomplete one it waits for the
  // daemon to open the gate (0), like the CPU. (A barrier put on list V still lets a word 2V'
  // of a newer list through: until the next barrier, the new list's tasks are not waited for.)
  const WatchList* list = g->watch.load(std::memory_order_acquire);
  const uint8_t* own = g->ctl + kOffGateClosed;
  if (list != nullptr && list->version != 0) {
    wait(device_word(g, cu, own, false), ~kClosed, kWaitNor);
  } else {
    wait(device_word(g, cu, own, false), 0, kWaitEq);
  }
  for (size_t i = 0; list != nullptr && i < list->n; ++i) {
    const uint8_t* b = list->blocks[i];
    wait(device_word(g, cu, b + kOffRequests, true), 0, kWaitEq);
    if (load32(b, kOffHinted) == 0) {  // its automatic activity counts too (wants_gpu)
      wait(device_word(g, cu, b + kOffAutoActive, true), 0, kWaitEq);
    }
  }
  g->barriers_put.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// A barrier could not be put (mu held): barriers are off for good, the daemon sees it
// (barriers_on) and the CPU stops for watched tasks again.
void barriers_failed(GateState* g, const std::exception& e) {
  g->barriers.store(false);
  store32(g->ctl, kOffBarriersOn, 0);
  g->next_barrier_work.store(std::numeric_limits<uint64_t>::max());
  g->error = std::string("barrier: ") + e.what();  // events still work: not failed
}

// Puts a barrier on the current stream every `barrier_ns` of estimated work.
void put_barrier(GateState* g, uint64_t work) {
  if (!barriers_hold(g)) {
    // off (the mark then stays at its maximum), or nobody more important is registered on this
    // GPU: nothing to hold for; look again one spacing later, without taking the lock
    if (g->barriers.load(std::memory_order_relaxed)) {
      g->next_barrier_work.store(work + g->barrier_ns, std::memory_order_relaxed);
    }
    return;
  }
  MaybeNoGil nogil;
  std::unique_lock<std::mutex> lock(g->mu, std::defer_lock);
  if (!lock.try_lock()) {
    nogil.release();
    lock.lock();
  }
  if (work < g->next_barrier_work.load(std::memory_order_relaxed) ||
      !g->barriers.load(std::memory_order_relaxed)) {
    return;  // another thread put this one, or barriers just failed
  }
  g->next_barrier_work.store(work + g->barrier_ns, std::memory_order_relaxed);
  if (!device_usable(g)) {
    return;
  }
  try {
    put_waits(g, g->impl->getStream(g->impl->getDevice()));
  } catch (const std::exception& e) {
    barriers_failed(g, e);
  }
}

// `name`: the operator's, or null for work RecordFunction does not see (graph replays).
inline void before_launch(GateState* g, const char* name) {
  const uint64_t n = g->launches.fetch_add(1) + 1;
  if (C10_UNLIKELY(g->sample_open.load(std::memory_order_acquire))) {
    // the previous operator was being timed: this one ends its span, before any wait below
    // (which must not count in it)
    finish_sample(g);
  }
  if (C10_UNLIKELY(must_wait(g, load32(g->ctl, kOffGateClosed),
                             g->watch.load(std::memory_order_acquire)))) {
    wait_open(g, reinterpret_cast<const uint32_t*>(g->ctl + kOffGateClosed), true, true);
  }
  if (C10_UNLIKELY(g_task_gates.load(std::memory_order_relaxed))) {
    const uint32_t* task_word = tls_task_word;
    if (task_word == nullptr) {
      task_word = g_default_task_word.load(std::memory_order_relaxed);
    }
    if (task_word != nullptr && __atomic_load_n(task_word, __ATOMIC_RELAXED) != 0) {
      wait_open(g, task_word, false, false);
    }
    if (tls_task_unbounded) {
      return;
    }
  }
  // costs matter only to a bounded gate: an unbounded one (a task that preempts) skips them
  OpCost* op = name != nullptr && g->cfg.op_costs && g->cfg.bound ? find_cost(g, name) : nullptr;
  uint64_t cost = op != nullptr ? op->ns.load(std::memory_order_relaxed) : 0;
  if (cost == 0) {
    cost = static_cast<uint64_t>(g->ns_per_launch.load(std::memory_order_relaxed));
  }
  const uint64_t work = g->work_ns.fetch_add(cost, std::memory_order_relaxed);
  if (C10_UNLIKELY(work >= g->next_barrier_work.load(std::memory_order_relaxed))) {
    put_barrier(g, work);
  }
  if (g->cfg.auto_activity && C10_UNLIKELY(g->active.load() == 0)) {
    mark_active(g);
    // learn the stream now: a short burst may never reach a segment boundary
    segment(g, n, work, cost, true);
  } else if (C10_UNLIKELY(n >= g->next_mark.load(std::memory_order_relaxed) ||
                          work + cost >= g->next_work_mark.load(std::memory_order_relaxed))) {
    segment(g, n, work, cost, false);
  }
  if (op != nullptr && C10_UNLIKELY(sample_due(op))) {
    start_sample(g, op);
  }
}

std::unique_ptr<at::ObserverContext> on_operator(const at::RecordFunction& fn) {
  GateState* g = g_gate.load(std::memory_order_acquire);
  if (C10_LIKELY(g != nullptr) && !g_in_child.load(std::memory_order_relaxed)) {
    before_launch(g, fn.name());
  }
  return nullptr;
}

// An operator ended: if it is the one being timed (no nested operator began meanwhile), its
// timing ends here rather than at the next operator, after whatever the caller does between.
void on_operator_end(const at::RecordFunction& /*fn*/, at::ObserverContext* /*ctx*/) {
  GateState* g = g_gate.load(std::memory_order_acquire);
  if (C10_LIKELY(g != nullptr) && C10_UNLIKELY(g->sample_open.load(std::memory_order_acquire)) &&
      !g_in_child.load(std::memory_order_relaxed) &&
      pthread_equal(g->sample_thread.load(std::memory_order_relaxed), pthread_self())) {
    finish_sample(g);
  }
}

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
bool may_sleep(GateState* g) {
  // a gate that detects its process's activity for others keeps its hook, unless the process
  // says when it is active with request() (hinted): then its launches no longer count
  const bool activity_unneeded =
      g->cfg.bound || !g->cfg.auto_activity || load32(g->ctl, kOffHinted) != 0;
  return activity_unneeded && load32(g->ctl, kOffSleepOk) != 0 &&
         load32(g->ctl, kOffGateClosed) == 0 &&
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
      const double keep = 1.0 - 1.0 / kAsleepDrainSpans;
      g->span_sum = g->span_sum * keep + ms;
      g->span_square = g->span_square * keep + ms * ms;
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
  g->span_sum = 0.0;
  g->span_square = 0.0;
}

// What a request starting now would wait for on average (ms): the spans' GPU times weighted by
// themselves (mu held).
double asleep_drain_ms(const GateState* g) {
  return g->span_sum > 0.0 ? g->span_square / g->span_sum : 0.0;
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
      // so that restoring "the previous device" after a record never touches device 0
      g->impl->setDevice(stream.device());
      device_set = true;
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

void sleep_loop(GateState* g, at::CallbackHandle handle) {
  bool device_set = false;
  while (!g->uninstalled.load()) {
    const bool asleep = g->asleep.load();
    sleep_ns(asleep ? kAsleepPollNs : kAwakePollNs);
    if (g->uninstalled.load()) {
      break;
    }
    bool can = may_sleep(g);
    if (asleep && can) {
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

// --- fork safety --------------------------------------------------------------------------------
void after_fork_in_child() {
  // A forked child (a DataLoader worker) has neither the parent's CUDA context nor its
  // background thread; the gate stays out of its way for good.
  g_in_child.store(true);
}

// --- the module's functions ----------------------------------------------------------------------
// The settings of the Python GateConfig `c`, read by their names (counts at least 1).
Config config_from(const py::handle& c) {
  Config cfg;
  cfg.bound = c.attr("bound").cast<bool>();
  cfg.auto_activity = c.attr("auto_activity").cast<bool>();
  cfg.record_every = std::max<uint64_t>(1, c.attr("record_every").cast<uint64_t>());
  cfg.open_record_every = std::max<uint64_t>(1, c.attr("open_record_every").cast<uint64_t>());
  cfg.window_launches = std::max<uint64_t>(1, c.attr("window_launches").cast<uint64_t>());
  cfg.open_window_launches =
      std::max<uint64_t>(1, c.attr("open_window_launches").cast<uint64_t>());
  cfg.window_ms = c.attr("window_ms").cast<double>();
  cfg.open_window_ms = c.attr("open_window_ms").cast<double>();
  cfg.tight_hold_ms = c.attr("tight_hold_ms").cast<double>();
  const std::string mode = c.attr("mode").cast<std::string>();
  if (mode == "adaptive") {
    cfg.mode = kAdaptive;
  } else if (mode == "tight") {
    cfg.mode = kTight;
  } else if (mode == "open") {
    cfg.mode = kOpen;
  } else {
    throw std::invalid_argument("unknown gate mode: " + mode);
  }
  cfg.idle_grace_ms = c.attr("idle_grace_ms").cast<double>();
  cfg.poll_us = c.attr("poll_us").cast<double>();
  cfg.op_costs = c.attr("op_costs").cast<bool>();
  cfg.asleep_barrier_ms = c.attr("asleep_barrier_ms").cast<double>();
  cfg.asleep_max_drain_ms = c.attr("asleep_max_drain_ms").cast<double>();
  cfg.backlog_hold_s = c.attr("backlog_hold_s").cast<double>();
  return cfg;
}

// `config`: a GateConfig. `device_live`: CUDA is initialised in this process already.
void install(uintptr_t control_address, int doorbell, const py::object& config,
             bool device_live) {
  const Config cfg = config_from(config);
  if (g_gate.load() != nullptr) {
    throw std::runtime_error("the launch gate is already installed in this process");
  }
  if (g_in_child.load()) {
    throw std::runtime_error("the launch gate cannot be installed in a forked child");
  }
  auto* g = new GateState();  // never freed: an operator on another thread may still read it
  g->cfg = cfg;
  g->ctl = reinterpret_cast<uint8_t*>(control_address);
  g->doorbell = doorbell;
  if (c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
    g->impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  }
  g->device_live.store(device_live && g->impl != nullptr);
  g->seen_generation = load32(g->ctl, kOffGeneration);
  g->next_mark.store(g->cfg.record_every);
  store32(g->ctl, kOffWindow, static_cast<uint32_t>(std::min<uint64_t>(g->cfg.window_launches,
                                                                        UINT32_MAX)));
  if (g->cfg.auto_activity) {
    g->bg = std::thread(activity_loop, g);
  }
  if (!g_atfork_registered) {
    pthread_atfork(nullptr, nullptr, after_fork_in_child);
    g_atfork_registered = true;
  }
  g_gate.store(g, std::memory_order_release);
  g_handle = at::addGlobalCallback(at::RecordFunctionCallback(on_operator, on_operator_end)
                                       .needsInputs(false)
                                       .needsOutputs(false)
                                       .needsIds(false)
                                       .scopes({at::RecordScope::FUNCTION}));
  store32(g->ctl, kOffInstalled, 1);
  g->sleeper = std::thread(sleep_loop, g, g_handle);
}

void uninstall() {
  GateState* g = g_gate.exchange(nullptr);
  if (g == nullptr) {
    return;
  }
  g->uninstalled.store(true);
  if (g->sleeper.joinable() && !g_in_child.load()) {
    g->sleeper.join();  // it re-enables the callback if it had disabled it
  }
  if (g_handle != 0) {
    at::removeCallback(g_handle);
    g_handle = 0;
  }
  store32(g->ctl, kOffInstalled, 0);
  store32(g->ctl, kOffBarriersOn, 0);
  if (g_in_child.load()) {
    return;  // the parent's thread and events do not exist here
  }
  if (g->bg.joinable()) {
    {
      std::lock_guard<std::mutex> lock(g->bg_mu);
      g->bg_stop = true;
    }
    g->bg_cv.notify_one();
    g->bg.join();
  }
  if (g->active.exchange(0) != 0) {
    publish_activity(g);
  }
  std::lock_guard<std::mutex> lock(g->mu);
  if (g->impl != nullptr && !g->failed.load()) {
    try {
      auto destroy = [g](void* ev, c10::DeviceIndex d) {
        if (ev != nullptr) {
          g->impl->destroyEvent(ev, d);
        }
      };
      for (auto& p : g->fifo) destroy(p.event, p.stream.device_index());
      for (auto& smp : g->samples) {
        destroy(smp.before, smp.device);
        destroy(smp.after, smp.device);
      }
      if (g->sample_op != nullptr) destroy(g->sample_before, g->sample_stream.device_index());
      for (auto& e : g->free_events) destroy(e.second, e.first);
      for (auto& k : g->streams) destroy(k.tail, k.stream.device_index());
      if (g->have_done) destroy(g->done.event, g->done.stream.device_index());
    } catch (const std::exception&) {
      // the context may be gone at interpreter exit; nothing to give back then
    }
  }
  g->fifo.clear();
  g->samples.clear();
  g->sample_op = nullptr;
  g->sample_before = nullptr;
  g->sample_open.store(false);
  g->free_events.clear();
  g->streams.clear();
  g->have_done = false;
}

GateState* current() {
  GateState* g = g_gate.load();
  if (g == nullptr) {
    throw std::runtime_error("the launch gate is not installed");
  }
  return g;
}

void drain() {
  GateState* g = g_gate.load();
  if (g == nullptr || g_in_child.load() || !device_usable(g)) {
    return;
  }
  std::lock_guard<std::mutex> lock(g->mu);
  try {
    if (!record_tails(g)) {
      return;
    }
    for (auto& k : g->streams) {
      if (k.tail != nullptr) {
        g->impl->synchronizeEvent(k.tail);
      }
    }
    reap(g);
  } catch (const std::exception& e) {
    note_error(g, "drain", e);
  }
}

py::dict stats() {
  py::dict d;
  GateState* g = g_gate.load();
  d["installed"] = g != nullptr;
  if (g == nullptr) {
    return d;
  }
  d["launches"] = g->launches.load();
  d["waits"] = g->waits.load();
  d["wait_seconds"] = static_cast<double>(g->wait_ns.load()) / 1e9;
  d["bound_waits"] = g->bound_waits.load();
  d["bound_wait_seconds"] = static_cast<double>(g->bound_wait_ns.load()) / 1e9;
  d["events_recorded"] = g->events_recorded.load();
  d["window"] = g->window.load();
  d["tight"] = g->tight_now.load();
  d["auto_active"] = g->active.load() != 0;
  d["activations"] = g->activations.load();
  d["device_live"] = g->device_live.load();
  d["captures"] = g->captures.load();
  d["barriers"] = g->barriers.load();
  d["barriers_put"] = g->barriers_put.load();
  d["barrier_fallbacks"] = g->barrier_fallbacks.load();
  d["asleep"] = g->asleep.load();
  d["sleeps"] = g->sleeps.load();
  d["asleep_barriers"] = g->asleep_barriers.load();
  d["backlog_wakes"] = g->backlog_wakes.load();
  d["asleep_drain_ms"] = g->asleep_drain_ms.load();
  d["asleep_longest_span_ms"] = g->asleep_longest_ms.load();
  const WatchList* list = g->watch.load(std::memory_order_acquire);
  d["watched"] = list != nullptr ? list->n : 0;
  d["watch_version"] = list != nullptr ? list->version : 0;
  size_t in_flight = 0;
  size_t streams = 0;
  double window_ns = 0.0;
  std::string error;
  if (!g_in_child.load()) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(g->mu);
    in_flight = g->fifo.size();
    streams = g->streams.size();
    window_ns = g->window_ns;
    error = g->error;
  }
  d["events_in_flight"] = in_flight;
  d["streams"] = streams;
  d["us_per_launch"] = g->ns_per_launch.load() / 1e3;
  d["window_us"] = window_ns / 1e3;
  d["work_seconds"] = static_cast<double>(g->work_ns.load()) / 1e9;
  // the learned per-operator costs: name, calls, us per call, exact timings, upper bounds
  py::list costs;
  uint64_t taken = 0;
  for (const OpCost& op : g->costs) {
    if (op.key.load() != 0 && op.named.load(std::memory_order_acquire)) {
      costs.append(py::make_tuple(std::string(op.name), op.calls.load(), op.ns.load() / 1e3,
                                  op.samples.load(), op.bounds.load()));
      taken += op.samples.load() + op.bounds.load();
    }
  }
  d["op_costs"] = costs;
  d["samples_taken"] = taken;
  d["samples_dropped"] = g->samples_dropped.load();
  d["error"] = error.empty() ? py::object(py::none()) : py::object(py::str(error));
  d["forked_child"] = g_in_child.load();
  return d;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "gpreempt's in-process launch gate (a RecordFunction callback)";
  m.def("install", &install, py::arg("control_address"), py::arg("doorbell"), py::arg("config"),
        py::arg("device_live"));
  m.def("uninstall", &uninstall, py::call_guard<py::gil_scoped_release>());
  m.def("drain", &drain, py::call_guard<py::gil_scoped_release>());
  m.def("stats", &stats);
  m.def("set_device_live", [](bool live) {
    GateState* g = g_gate.load();
    if (g != nullptr) {
      g->device_live.store(live && g->impl != nullptr);
    }
  });
  m.def("capture_begin", []() {
    GateState* g = g_gate.load();
    if (g != nullptr) {
      g->captures.fetch_add(1);
    }
  });
  m.def("capture_end", []() {
    GateState* g = g_gate.load();
    if (g != nullptr && g->captures.load() > 0) {
      g->captures.fetch_sub(1);
    }
  });
  m.def("before_launch", []() {
    // for launches RecordFunction does not see (CUDA graph replays)
    GateState* g = g_gate.load();
    if (g != nullptr && !g_in_child.load()) {
      before_launch(g, "gpreempt::graph_replay");
    }
  });
  m.def("in_forked_child", []() { return g_in_child.load(); });
  // `hip`: a ROCm build of PyTorch (torch.version.hip), whose barriers go through HIP
  m.def(
      "set_barriers",
      [](double barrier_ms, bool hip) {
        GateState* g = g_gate.load();
        if (g == nullptr || g->impl == nullptr || !g->cfg.bound) {
          return false;
        }
        bool on = barrier_ms > 0.0 && (hip ? hip_api() != nullptr : cu_api() != nullptr);
        std::string refused;
        if (hip && barrier_ms > 0.0) {  // HIP's own test, and never a silent refusal
          if (!on) {
            refused = "the HIP runtime offers no hipStreamWaitValue32";
          } else if (!hip_waits_supported(hip_api(), &refused)) {
            on = false;
          }
        }
        std::lock_guard<std::mutex> lock(g->mu);
        if (!refused.empty()) {
          g->error = "barrier: " + refused;  // events still work: not failed
        }
        g->hip = hip;
        g->barrier_ns = static_cast<uint64_t>(std::max(0.0, barrier_ms) * 1e6);
        g->barriers.store(on);
        store32(g->ctl, kOffBarriersOn, on ? 1u : 0u);  // the daemon's backstop leaves it alone
        g->next_barrier_work.store(on ? g->work_ns.load()
                                      : std::numeric_limits<uint64_t>::max());
        return on;
      },
      py::arg("barrier_ms"), py::arg("hip") = false);
  // Tests: queue one barrier's HIP waits on `stream` through the HIP library at `library` (a
  // fake that records its calls, on machines without ROCm), for the control block at `own`
  // watching the blocks at `watched` (list `version`). Returns the number of pages asked for
  // and the barriers that fell back to the own word alone.
  m.def("_hip_waits_for_test", [](const std::string& library, uintptr_t stream, uintptr_t own,
                                  const std::vector<uintptr_t>& watched, uint32_t version) {
    const HipApi* hip = hip_api_from(dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL));
    if (hip == nullptr) {
      throw std::runtime_error(library + " does not offer the HIP functions the gate uses");
    }
    auto g = std::make_unique<GateState>();
    g->ctl = reinterpret_cast<uint8_t*>(own);
    WatchList list;
    for (uintptr_t a : watched) {
      if (list.n < kMaxWatched) {
        list.blocks[list.n++] = reinterpret_cast<const uint8_t*>(a);
      }
    }
    list.version = version;
    g->watch.store(watched.empty() ? nullptr : &list);
    std::lock_guard<std::mutex> lock(g->mu);
    put_hip_waits(g.get(), hip, reinterpret_cast<void*>(stream));
    return py::make_tuple(g->device_pages.size(), g->barrier_fallbacks.load());
  });
  // Tests: whether the HIP library at `library` says the current device runs stream waits,
  // and why not.
  m.def("_hip_support_for_test", [](const std::string& library) {
    const HipApi* hip = hip_api_from(dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL));
    if (hip == nullptr) {
      throw std::runtime_error(library + " does not offer the HIP functions the gate uses");
    }
    std::string why;
    const bool ok = hip_waits_supported(hip, &why);
    return py::make_tuple(ok, why);
  });
  m.def("watch", [](const std::vector<uintptr_t>& addresses, uint32_t version) {
    GateState* g = g_gate.load();
    if (g == nullptr) {
      return;
    }
    const WatchList* list = nullptr;
    if (!addresses.empty()) {
      auto* fresh = new WatchList();  // never freed: a thread may still read the old one
      for (uintptr_t a : addresses) {
        if (fresh->n < kMaxWatched && a != 0) {
          fresh->blocks[fresh->n++] = reinterpret_cast<const uint8_t*>(a);
        }
      }
      // a list cut short is not the one the daemon versioned
      fresh->version = fresh->n == addresses.size() ? version : 0;
      list = fresh;
    }
    g->watch.store(list, std::memory_order_release);
  });
  m.def("bind_thread", [](uintptr_t word, bool unbounded) {
    if (word != 0) {
      g_task_gates.store(true);
    }
    tls_task_word = reinterpret_cast<const uint32_t*>(word);
    tls_task_unbounded = word != 0 && unbounded;
  });
  m.def("set_default_task_word", [](uintptr_t word) {
    if (word != 0) {
      g_task_gates.store(true);
    }
    g_default_task_word.store(reinterpret_cast<const uint32_t*>(word));
  });
}
