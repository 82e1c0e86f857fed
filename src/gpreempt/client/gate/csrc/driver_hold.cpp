// The driver-level gate's work on each launch: count it, wait while closed and publish the
// activity of tasks that preempt others (launch_hold.h), put stream barriers, bound the work in
// flight.
#include "driver_gate.h"

namespace gpreempt_driver {

void ring(Gate& g) { ring_doorbell(g.doorbell); }

// Whether this gate's barriers hold its queued work now: the daemon gives it an in-flight
// share only while a more important task is registered on its GPU.
bool barriers_hold(Gate& g, const uint8_t* ctl) {
  return g.cfg.bound && g.cfg.barrier_us > 0 && g.barriers_ok.load(std::memory_order_relaxed) &&
         load32(ctl, kOffWindowShareUs) != 0;
}

// The rule of the operator gate (gpreempt.control.released_by_watch): a gate closed only while
// watch list V is active goes on once none is; with barriers the CPU does not stop for watched
// tasks (the GPU does). A task at `high` or above has no barriers: while a more important task
// it watches is active, its launches wait on the CPU.
bool must_wait(Gate& g, uint32_t word, const WatchList* w) {
  if (word == 0 || closed_while_watched(word, w)) {
    const uint8_t* ctl = g.ctl.load(std::memory_order_relaxed);
    return watched_active(w) && !barriers_hold(g, ctl);
  }
  return true;
}

namespace {

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
  hold_launch(g, ctl, [&g](uint32_t word, const WatchList* w) { return must_wait(g, word, w); });
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
  // a launch the driver refused (a bad stream, say) queued nothing: no mark, and no barrier
  // that would fail there and turn the barriers off for good
  const auto* result = static_cast<const CUresult*>(data->functionReturnValue);
  if (result != nullptr && *result != CUDA_SUCCESS) {
    return;
  }
  const bool activity = launches_tell_activity(g);
  const bool bounded = g.cfg.bound && g.cfg.barrier_us > 0 && load32(ctl, kOffWindowShareUs) != 0;
  if (!activity && !bounded) {
    return;
  }
  const Guard guard;
  const StreamKey key = stream_key(data->context, stream);
  bool over_window = false;
  {
    std::lock_guard<std::mutex> lock(g.mu);
    auto [it, fresh] = g.streams.try_emplace(key);
    StreamState& st = it->second;
    if (fresh) {
      // a created stream's own context: a copy may be queued on another device's stream
      CUcontext own = nullptr;
      st.context = key.context == nullptr && key.stream != nullptr &&
                           cu()->cuStreamGetCtx(stream, &own) == CUDA_SUCCESS && own != nullptr
                       ? own
                       : data->context;
      store32(ctl, kOffDriverStreams, static_cast<uint32_t>(g.streams.size()));
      if (key.stream == CU_STREAM_PER_THREAD) {
        g.per_thread.store(true);  // no pacing: the gate's thread cannot put its barriers
      }
    }
    st.dirty = true;
    ++st.since_mark;
    if (bounded && st.since_mark >= st.spacing && !(capture_possible(g) && capturing(stream))) {
      // its events are of the stream's context, current but for a copy to another device's
      const CurrentContext current(st.context != data->context ? st.context : nullptr);
      over_window = mark(g, ctl, stream, st);
    }
  }
  if (over_window) {
    bound_wait(g, ctl, key);
  }
}

}  // namespace gpreempt_driver
