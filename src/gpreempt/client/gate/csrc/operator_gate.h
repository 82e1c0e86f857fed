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
// register theirs under DeviceType::CUDA), so the gate needs no CUDA headers and builds
// against any PyTorch, CPU-only included. With a CPU-only PyTorch the gate still counts launches
// and honours gate_closed; it records no events.
//
// The gate's files (one extension, TORCH_EXTENSION_NAME, built by gpreempt/client/gate/build.py):
//   operator_gate.h                  its state (GateState) and the functions its files share
//   operator_gate_base.h             control block words, clocks, waits, device features
//   operator_gate_hook.cpp           the per-operator path, operator costs, in-process task words
//   operator_gate_window.cpp         waiting at a closed gate, activity, the in-flight window
//   operator_gate_events.cpp         events, retiring them, operator timings
//   operator_gate_barriers_cuda.cpp  stream barriers through libcuda
//   operator_gate_barriers_hip.cpp   stream barriers through the HIP runtime (hip_api.h)
//   operator_gate_threads.cpp        the activity thread and the sleep thread
//   operator_gate_install.cpp        install, uninstall, drain, stats
//   operator_gate_module.cpp         the Python module (the functions by their Python names)
#pragma once

#include "asleep_drain.h"
#include "operator_gate_base.h"

namespace gpreempt_gate {

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
  // the driver-level gate publishes auto_active from every launch instead (hand_activity),
  // while it holds CUPTI (activity_handed_now)
  std::atomic<bool> activity_handed{false};
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
  Pending done{nullptr, 0, 0, 0, 0,
               c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::kCPU)), false};
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
  gpreempt_asleep::ExpectedWait asleep_wait;  // from the spans between those barriers
  int64_t next_asleep_barrier_ns = 0;
  std::string error;
  std::unordered_map<uintptr_t, uint64_t> device_pages;  // host page -> its device address

  std::mutex publish_mu;
  std::mutex bg_mu;
  std::condition_variable bg_cv;
  bool bg_stop = false;
  std::thread bg;
};

// The barriers register control block pages with the driver one page at a time.
constexpr uintptr_t kPage = 4096;

// The installed gate (never freed), and whether this process is a forked child.
extern std::atomic<GateState*> g_gate;
extern std::atomic<bool> g_in_child;
// Set once a scheduler binds a thread or a default word (operator_gate_hook.cpp).
extern std::atomic<bool> g_task_gates;

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

// --- operator_gate_hook.cpp ---------------------------------------------------------------------
std::unique_ptr<at::ObserverContext> on_operator(const at::RecordFunction& fn);
void on_operator_end(const at::RecordFunction& fn, at::ObserverContext* ctx);
void before_graph_replay();
void bind_thread(uintptr_t word, bool unbounded);
void set_default_task_word(uintptr_t word);
void after_fork_in_child();

// --- operator_gate_window.cpp -------------------------------------------------------------------
void ring(GateState* g);
bool activity_handed_now(const GateState* g);
void publish_activity(GateState* g);
void note_error(GateState* g, const char* where, const std::exception& e);
bool device_usable(GateState* g);
void wait_open(GateState* g, const uint32_t* word, bool watch, bool woken);
void mark_active(GateState* g);
void segment(GateState* g, uint64_t n, uint64_t work, uint64_t cost, bool force);

// --- operator_gate_events.cpp (all with mu held, but start_sample and finish_sample) ------------
void* take_event(GateState* g, c10::DeviceIndex device);
void give_event(GateState* g, void* ev, c10::DeviceIndex device);
void retire_front(GateState* g);
void reap(GateState* g);
void wait_event(GateState* g, void* ev, MaybeNoGil& nogil);
void remember_stream(GateState* g, const c10::Stream& s);
bool record_tails(GateState* g);
bool tails_done(GateState* g);
void start_sample(GateState* g, OpCost* op);
void finish_sample(GateState* g);

// --- operator_gate_barriers_cuda.cpp -------------------------------------------------------------
struct CuApi;
const CuApi* cu_api();
bool put_waits(GateState* g, const c10::Stream& stream);
void barriers_failed(GateState* g, const std::exception& e);
void put_barrier(GateState* g, uint64_t work);

// --- operator_gate_barriers_hip.cpp --------------------------------------------------------------
struct HipApi;
const HipApi* hip_api_from(void* lib);
const HipApi* hip_api();
bool hip_waits_supported(const HipApi* hip, std::string* why);
void put_hip_waits(GateState* g, const HipApi* hip, void* stream);

// --- operator_gate_threads.cpp -------------------------------------------------------------------
void activity_loop(GateState* g);
void sleep_loop(GateState* g, at::CallbackHandle handle);

}  // namespace gpreempt_gate
