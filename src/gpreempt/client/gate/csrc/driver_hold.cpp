// The driver-level gate's work on each launch: wait while closed, count, put stream barriers,
// bound the work in flight; and the activity it publishes for tasks that preempt others.
#include <dlfcn.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "driver_gate.h"

namespace gpreempt_driver {

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

void ring(Gate& g) {
  if (g.doorbell < 0) {
    return;
  }
  uint64_t one = 1;
  ssize_t ignored = write(g.doorbell, &one, sizeof(one));  // EAGAIN: it rings already
  (void)ignored;
}

// Whether a watched task wants the GPU (gpreempt.control.wants_gpu).
bool watched_active(const WatchList* w) {
  for (size_t i = 0; w != nullptr && i < w->n; ++i) {
    const uint8_t* b = w->blocks[i];
    if (load32(b, kOffRequests) != 0 ||
        (load32(b, kOffAutoActive) != 0 && load32(b, kOffHinted) == 0)) {
      return true;
    }
  }
  return false;
}

namespace {

bool closed_while_watched(uint32_t word, const WatchList* w) {
  return word != 0 && (word & 1u) == 0 && w != nullptr && w->version != 0 &&
         word / 2 == w->version;
}

// Whether this gate's barriers hold its queued work now: the daemon gives it an in-flight
// share only while a more important task is registered on its GPU.
bool barriers_hold(Gate& g, const uint8_t* ctl) {
  return g.cfg.bound && g.cfg.barrier_us > 0 && g.barriers_ok.load(std::memory_order_relaxed) &&
         load32(ctl, kOffWindowShareUs) != 0;
}

}  // namespace

// The rule of the operator gate (gpreempt.control.released_by_watch): a gate closed only while
// watch list V is active goes on once none is; with barriers the CPU does not stop for watched
// tasks (the GPU does).
bool must_wait(Gate& g, uint32_t word, const WatchList* w) {
  if (word == 0 || closed_while_watched(word, w)) {
    const uint8_t* ctl = g.ctl.load(std::memory_order_relaxed);
    return g.cfg.bound && watched_active(w) && !barriers_hold(g, ctl);
  }
  return true;
}

namespace {

thread_local bool t_inside = false;  // our own driver calls are not launches of the program

// Lets other Python threads run while this one waits (the client's own threads among them).
class NoGil {
 public:
  NoGil() {
    using Check = int (*)();
    using Save = void* (*)();
    static const auto initialized = reinterpret_cast<Check>(dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
    static const auto held = reinterpret_cast<Check>(dlsym(RTLD_DEFAULT, "PyGILState_Check"));
    static const auto save = reinterpret_cast<Save>(dlsym(RTLD_DEFAULT, "PyEval_SaveThread"));
    if (initialized != nullptr && held != nullptr && save != nullptr && initialized() != 0 &&
        held() != 0) {
      state_ = save();
    }
  }
  ~NoGil() {
    using Restore = void (*)(void*);
    static const auto restore =
        reinterpret_cast<Restore>(dlsym(RTLD_DEFAULT, "PyEval_RestoreThread"));
    if (state_ != nullptr && restore != nullptr) {
      restore(state_);
    }
  }
  NoGil(const NoGil&) = delete;
  NoGil& operator=(const NoGil&) = delete;

 private:
  void* state_ = nullptr;
};

// Our calls must not disturb a graph another thread captures in global mode.
class RelaxedCapture {
 public:
  RelaxedCapture() { cu()->cuThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { cu()->cuThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
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

struct Guard {
  Guard() { t_inside = true; }
  ~Guard() { t_inside = false; }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
};

// The stream a launch goes to. Per-thread default streams: the _ptsz entry points with stream 0.
bool launch_stream(CUpti_CallbackId cbid, const void* params, CUstream* out) {
  switch (cbid) {
#define GP_STREAM_OF(id, type, field)                             \
  case CUPTI_DRIVER_TRACE_CBID_##id:                              \
    *out = static_cast<const type*>(params)->field;               \
    return true;
#define GP_STREAM_OF_PTSZ(id, type, field)                        \
  case CUPTI_DRIVER_TRACE_CBID_##id: {                            \
    CUstream s = static_cast<const type*>(params)->field;         \
    *out = s == nullptr ? CU_STREAM_PER_THREAD : s;               \
    return true;                                                  \
  }
    GP_STREAM_OF(cuLaunchKernel, cuLaunchKernel_params, hStream)
    GP_STREAM_OF_PTSZ(cuLaunchKernel_ptsz, cuLaunchKernel_ptsz_params, hStream)
    GP_STREAM_OF(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_params, hStream)
    GP_STREAM_OF_PTSZ(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel_ptsz_params,
                      hStream)
    GP_STREAM_OF(cuGraphLaunch, cuGraphLaunch_params, hStream)
    GP_STREAM_OF_PTSZ(cuGraphLaunch_ptsz, cuGraphLaunch_ptsz_params, hStream)
    GP_STREAM_OF(cuMemcpyAsync, cuMemcpyAsync_params, hStream)
    GP_STREAM_OF_PTSZ(cuMemcpyAsync_ptsz, cuMemcpyAsync_ptsz_params, hStream)
    GP_STREAM_OF(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_params, hStream)
    GP_STREAM_OF_PTSZ(cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync_v2_ptsz_params, hStream)
    GP_STREAM_OF(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_params, hStream)
    GP_STREAM_OF_PTSZ(cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync_v2_ptsz_params, hStream)
    GP_STREAM_OF(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_params, hStream)
    GP_STREAM_OF_PTSZ(cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoDAsync_v2_ptsz_params, hStream)
    GP_STREAM_OF(cuMemsetD8Async, cuMemsetD8Async_params, hStream)
    GP_STREAM_OF_PTSZ(cuMemsetD8Async_ptsz, cuMemsetD8Async_ptsz_params, hStream)
    GP_STREAM_OF(cuMemsetD32Async, cuMemsetD32Async_params, hStream)
    GP_STREAM_OF_PTSZ(cuMemsetD32Async_ptsz, cuMemsetD32Async_ptsz_params, hStream)
#undef GP_STREAM_OF
#undef GP_STREAM_OF_PTSZ
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx: {
      const auto* p = static_cast<const cuLaunchKernelEx_params*>(params);
      *out = p->config != nullptr ? p->config->hStream : nullptr;
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: {
      const auto* p = static_cast<const cuLaunchKernelEx_ptsz_params*>(params);
      CUstream s = p->config != nullptr ? p->config->hStream : nullptr;
      *out = s == nullptr ? CU_STREAM_PER_THREAD : s;
      return true;
    }
    default:
      return false;  // still held at the gate; its stream is not followed
  }
}

bool capturing(CUstream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return cu()->cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS ||
         status != CU_STREAM_CAPTURE_STATUS_NONE;
}

void wait_open(Gate& g, uint8_t* ctl) {
  NoGil nogil;
  auto* word = reinterpret_cast<uint32_t*>(ctl + kOffGateClosed);
  const int64_t start = now_ns();
  add64(ctl, kOffDriverWaits, 1);
  for (int spins = 0;;) {
    const uint32_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    const WatchList* list = g.watch.load(std::memory_order_acquire);
    if (!must_wait(g, seen, list)) {
      break;
    }
    if (spins < 256) {
      ++spins;
      continue;
    }
    timespec timeout{0, 1000000};  // the daemon wakes us; watched words are polled
    if (seen != 0 && !closed_while_watched(seen, list)) {
      syscall(SYS_futex, word, FUTEX_WAIT, seen, &timeout, nullptr, 0);
    } else {
      timespec poll{0, 30000};
      nanosleep(&poll, nullptr);
    }
  }
  add64(ctl, kOffDriverWaitNs, static_cast<uint64_t>(now_ns() - start));
}

CUevent take_event(Gate& g) {
  if (!g.spare_events.empty()) {
    CUevent e = g.spare_events.back();
    g.spare_events.pop_back();
    return e;
  }
  CUevent e = nullptr;
  return cu()->cuEventCreate(&e, CU_EVENT_DEFAULT) == CUDA_SUCCESS ? e : nullptr;
}

void give_event(Gate& g, CUevent e) {
  if (e != nullptr) {
    g.spare_events.push_back(e);
  }
}

// The device address of a control block word; its page is registered once and stays so.
CUdeviceptr device_word(Gate& g, const uint8_t* word, bool read_only) {
  const uintptr_t page = reinterpret_cast<uintptr_t>(word) & ~uintptr_t{4095};
  auto it = g.device_pages.find(page);
  if (it == g.device_pages.end()) {
    void* host = reinterpret_cast<void*>(page);
    const unsigned flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                           (read_only ? CU_MEMHOSTREGISTER_READ_ONLY : 0u);
    const CUresult r = cu()->cuMemHostRegister(host, 4096, flags);
    CUdeviceptr device = 0;
    if ((r != CUDA_SUCCESS && r != CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) ||
        cu()->cuMemHostGetDevicePointer(&device, host, 0) != CUDA_SUCCESS) {
      return 0;
    }
    it = g.device_pages.emplace(page, device).first;
  }
  return it->second + (reinterpret_cast<uintptr_t>(word) - page);
}

// Waits on the GPU, on `stream`, for this gate's word and the watched tasks' activity words:
// the GPU stops this task's queued work there the moment one says so.
bool put_barrier(Gate& g, uint8_t* ctl, CUstream stream) {
  const WatchList* list = g.watch.load(std::memory_order_acquire);
  const CUdeviceptr own = device_word(g, ctl + kOffGateClosed, false);
  if (own == 0) {
    return false;
  }
  CUresult r = list != nullptr && list->version != 0
                   ? cu()->cuStreamWaitValue32(stream, own, ~kClosed, CU_STREAM_WAIT_VALUE_NOR)
                   : cu()->cuStreamWaitValue32(stream, own, 0, CU_STREAM_WAIT_VALUE_EQ);
  for (size_t i = 0; r == CUDA_SUCCESS && list != nullptr && i < list->n; ++i) {
    const uint8_t* b = list->blocks[i];
    const CUdeviceptr requests = device_word(g, b + kOffRequests, true);
    r = requests == 0 ? CUDA_ERROR_UNKNOWN
                      : cu()->cuStreamWaitValue32(stream, requests, 0, CU_STREAM_WAIT_VALUE_EQ);
    if (r == CUDA_SUCCESS && load32(b, kOffHinted) == 0) {
      const CUdeviceptr active = device_word(g, b + kOffAutoActive, true);
      r = active == 0 ? CUDA_ERROR_UNKNOWN
                      : cu()->cuStreamWaitValue32(stream, active, 0, CU_STREAM_WAIT_VALUE_EQ);
    }
  }
  return r == CUDA_SUCCESS;
}

// Retires the stream's completed marks, learning the GPU time per launch from the spans the
// GPU ran back to back.
void reap(Gate& g, StreamState& st) {
  while (st.marks.size() > 1) {
    Mark& first = st.marks[0];
    Mark& second = st.marks[1];
    if (cu()->cuEventQuery(second.event) != CUDA_SUCCESS) {
      return;
    }
    float ms = 0.0f;
    if (second.gpu_was_busy && second.launches > 0 &&
        cu()->cuEventElapsedTime(&ms, first.event, second.event) == CUDA_SUCCESS && ms >= 0.0f) {
      const double ns = ms * 1e6 / static_cast<double>(second.launches);
      st.ns_per_launch = st.ns_per_launch == 0.0 ? ns : 0.8 * st.ns_per_launch + 0.2 * ns;
      const double want = g.cfg.barrier_us * 1000.0 / std::max(st.ns_per_launch, 1.0);
      st.spacing = static_cast<uint64_t>(std::clamp(want, 1.0, 4096.0));
    }
    give_event(g, first.event);
    st.marks.pop_front();
  }
}

double in_flight_ns(const StreamState& st) {
  uint64_t launches = st.since_mark;
  for (size_t i = 1; i < st.marks.size(); ++i) {
    launches += st.marks[i].launches;
  }
  return static_cast<double>(launches) * st.ns_per_launch;
}

// Mark the stream: a barrier where one holds, an event behind it, and the window enforced.
void mark(Gate& g, uint8_t* ctl, CUstream stream, StreamState& st) {
  const RelaxedCapture relaxed;
  if (barriers_hold(g, ctl)) {
    if (put_barrier(g, ctl, stream)) {
      add64(ctl, kOffDriverBarriers, 1);
    } else {
      g.barriers_ok.store(false);
    }
  }
  CUevent e = take_event(g);
  if (e == nullptr || cu()->cuEventRecord(e, stream) != CUDA_SUCCESS) {
    give_event(g, e);
    return;
  }
  Mark m;
  m.event = e;
  m.launches = st.since_mark;
  m.gpu_was_busy = !st.marks.empty() && cu()->cuEventQuery(st.marks.back().event) != CUDA_SUCCESS;
  st.marks.push_back(m);
  st.since_mark = 0;
  reap(g, st);
  while (st.ns_per_launch > 0 && st.marks.size() > 1 &&
         in_flight_ns(st) > g.cfg.window_ms * 1e6) {
    CUevent oldest = st.marks[1].event;
    {
      NoGil nogil;
      cu()->cuEventSynchronize(oldest);
    }
    reap(g, st);
  }
}

}  // namespace

void before_launch(CUpti_CallbackId /*cbid*/, const CUpti_CallbackData* /*data*/) {
  if (t_inside) {
    return;
  }
  Gate& g = gate();
  uint8_t* ctl = g.ctl.load(std::memory_order_acquire);
  if (ctl == nullptr) {
    return;
  }
  add64(ctl, kOffDriverLaunches, 1);
  const uint32_t word = load32(ctl, kOffGateClosed);
  if (word != 0 || g.watch.load(std::memory_order_relaxed) != nullptr) {
    if (must_wait(g, word, g.watch.load(std::memory_order_acquire))) {
      wait_open(g, ctl);
    }
  }
  if (g.cfg.auto_activity && !g.cfg.torch_gate) {
    g.last_launch_ns.store(now_ns(), std::memory_order_relaxed);
    if (g.active.exchange(1) == 0) {
      store32(ctl, kOffAutoActive, 1);
      ring(g);
    }
  }
}

void after_launch(CUpti_CallbackId cbid, const CUpti_CallbackData* data) {
  if (t_inside) {
    return;
  }
  Gate& g = gate();
  uint8_t* ctl = g.ctl.load(std::memory_order_acquire);
  CUstream stream = nullptr;
  if (ctl == nullptr || !launch_stream(cbid, data->functionParams, &stream)) {
    return;
  }
  const bool activity = g.cfg.auto_activity && !g.cfg.torch_gate;
  const bool bounded = g.cfg.bound && g.cfg.barrier_us > 0 && load32(ctl, kOffWindowShareUs) != 0;
  if (!activity && !bounded) {
    return;
  }
  const Guard guard;
  std::lock_guard<std::mutex> lock(g.mu);
  auto [it, fresh] = g.streams.try_emplace(stream);
  StreamState& st = it->second;
  if (fresh) {
    st.context = data->context;
    store32(ctl, kOffDriverStreams, static_cast<uint32_t>(g.streams.size()));
  }
  st.dirty = true;
  ++st.since_mark;
  if (bounded && st.since_mark >= st.spacing && !capturing(stream)) {
    mark(g, ctl, stream, st);
  }
}

void forget_stream(CUstream stream) {
  Gate& g = gate();
  const Guard guard;
  std::lock_guard<std::mutex> lock(g.mu);
  auto it = g.streams.find(stream);
  if (it == g.streams.end()) {
    return;
  }
  for (Mark& m : it->second.marks) {
    cu()->cuEventDestroy(m.event);  // released once its work completed
  }
  g.streams.erase(it);
}

void check_idle(Gate& g, int64_t now) {
  uint8_t* ctl = g.ctl.load(std::memory_order_acquire);
  if (ctl == nullptr || g.active.load() == 0 ||
      now - g.last_launch_ns.load(std::memory_order_relaxed) <
          static_cast<int64_t>(g.cfg.idle_grace_ms * 1e6)) {
    return;
  }
  const Guard guard;
  std::lock_guard<std::mutex> lock(g.mu);
  const RelaxedCapture relaxed;
  bool done = true;
  for (auto& [stream, st] : g.streams) {
    const CurrentContext current(st.context);
    if (st.dirty && !capturing(stream)) {
      // an event behind the stream's last launch tells when its work completed
      CUevent e = take_event(g);
      if (e != nullptr && cu()->cuEventRecord(e, stream) == CUDA_SUCCESS) {
        st.marks.push_back(Mark{e, st.since_mark, false});
        st.since_mark = 0;
      } else {
        give_event(g, e);
      }
      st.dirty = false;
    }
    if (!st.marks.empty() && cu()->cuEventQuery(st.marks.back().event) == CUDA_ERROR_NOT_READY) {
      done = false;
    }
    reap(g, st);
  }
  if (!done || g.active.exchange(0) == 0) {
    return;
  }
  store32(ctl, kOffAutoActive, 0);
  if (g.last_launch_ns.load(std::memory_order_acquire) > now) {
    // a launch came in meanwhile, and saw the gate still active: it stays active
    g.active.store(1);
    store32(ctl, kOffAutoActive, 1);
  }
  ring(g);
}

}  // namespace gpreempt_driver
