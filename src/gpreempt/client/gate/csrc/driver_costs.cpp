// The driver-level gate's cost of each kernel (and graph): one launch of it timed now and then
// between two timed events, as the operator gate times operators. The barriers are then spaced
// by what the launches since the last one cost: a stream's average per launch is a poor guide
// where a step mixes kernels of a few microseconds with GEMMs of hundreds (a compiled model),
// and a span of "0.2 ms on average" may hold several times that, which a starting request of a
// more important task waits out.
#include <algorithm>

#include "driver_gate.h"

namespace gpreempt_driver {

namespace {

// The launch under way on this thread (before_launch to after_launch, one driver call: the
// same correlation id): its function's entry, and the timing opened for it, if any. A call
// whose exit the gate did not see (it fell asleep meanwhile) is told by its id.
struct OpenSample {
  CUevent before = nullptr;
  CUstream stream = nullptr;
  FnCost* fn = nullptr;
};
struct UnderWay {
  uint32_t correlation = 0;
  FnCost* fn = nullptr;
  OpenSample sample;
};
thread_local UnderWay t_launch;

// What a launch runs: its CUfunction or CUgraphExec (0 for copies and memsets, which are
// counted at the stream's average).
uintptr_t launch_key(CUpti_CallbackId cbid, const void* params) {
  switch (cbid) {
#define GP_KEY_OF(id, type, field)                                        \
  case CUPTI_DRIVER_TRACE_CBID_##id:                                      \
    return reinterpret_cast<uintptr_t>(static_cast<const type*>(params)->field);
    GP_KEY_OF(cuLaunchKernel, cuLaunchKernel_params, f)
    GP_KEY_OF(cuLaunchKernel_ptsz, cuLaunchKernel_ptsz_params, f)
    GP_KEY_OF(cuLaunchKernelEx, cuLaunchKernelEx_params, f)
    GP_KEY_OF(cuLaunchKernelEx_ptsz, cuLaunchKernelEx_ptsz_params, f)
    GP_KEY_OF(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_params, f)
    GP_KEY_OF(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel_ptsz_params, f)
    GP_KEY_OF(cuGraphLaunch, cuGraphLaunch_params, hGraph)
    GP_KEY_OF(cuGraphLaunch_ptsz, cuGraphLaunch_ptsz_params, hGraphExec)
#undef GP_KEY_OF
    default:
      return 0;
  }
}

// The key's slot, claimed on first sight; null where the table has no room near its hash.
FnCost* find_fn(Gate& g, uintptr_t key) {
  size_t i = static_cast<size_t>((key >> 4) * 0x9E3779B97F4A7C15ull >> 40) & (kFnSlots - 1);
  for (size_t probe = 0; probe < kFnProbes; ++probe, i = (i + 1) & (kFnSlots - 1)) {
    FnCost& slot = g.fn_costs[i];
    uintptr_t seen = slot.key.load(std::memory_order_acquire);
    if (seen == key) {
      return &slot;
    }
    if (seen == 0) {
      if (slot.key.compare_exchange_strong(seen, key, std::memory_order_acq_rel) ||
          seen == key) {
        return &slot;
      }
    }
  }
  return nullptr;
}

// Whether to time this launch of the function: its first launches until four exact timings
// came, then one in 256 (costs drift little).
bool sample_due(FnCost* fn) {
  const uint32_t calls = fn->calls.fetch_add(1, std::memory_order_relaxed) + 1;
  return (calls <= 64 && fn->samples.load(std::memory_order_relaxed) < 4) || (calls & 255) == 0;
}

}  // namespace

void before_costed_launch(Gate& g, CUpti_CallbackId cbid, const CUpti_CallbackData* data) {
  const uintptr_t key = launch_key(cbid, data->functionParams);
  FnCost* fn = key != 0 ? find_fn(g, key) : nullptr;
  t_launch.correlation = data->correlationId;
  t_launch.fn = fn;
  CUstream stream = nullptr;
  if (fn == nullptr || !sample_due(fn) || !launch_stream(cbid, data->functionParams, &stream)) {
    return;
  }
  const Guard guard;
  std::lock_guard<std::mutex> lock(g.mu);
  const RelaxedCapture relaxed;
  if (t_launch.sample.before != nullptr) {
    give_event(g, t_launch.sample.before, true);  // its launch's exit never came
    t_launch.sample = OpenSample{};
  }
  if (capturing(stream)) {
    return;
  }
  CUevent before = record_before(g, stream);
  if (before != nullptr) {
    t_launch.sample = OpenSample{before, stream, fn};
  }
}

bool fn_sample_open() { return t_launch.sample.before != nullptr; }

FnCost* launched_fn(const CUpti_CallbackData* data) {
  FnCost* fn = t_launch.correlation == data->correlationId ? t_launch.fn : nullptr;
  t_launch.fn = nullptr;
  return fn;
}

// The launch's timing ends behind it (mu held), before any barrier the launch brings: the
// span holds this launch alone. `exact`: the GPU had not reached the timing's start when its
// end was recorded, so the launch ran between them with no gap; otherwise the span is an
// upper bound (by a launch's latency).
void end_fn_sample(Gate& g, const CUpti_CallbackData* data, CUstream stream) {
  const OpenSample open = t_launch.sample;
  t_launch.sample = OpenSample{};
  if (open.before == nullptr) {
    return;
  }
  const RelaxedCapture relaxed;
  const auto* result = static_cast<const CUresult*>(data->functionReturnValue);
  const bool launched = result == nullptr || *result == CUDA_SUCCESS;
  if (!launched || t_launch.correlation != data->correlationId || stream != open.stream ||
      capturing(stream)) {
    give_event(g, open.before, true);
    return;
  }
  const bool exact = cu()->cuEventQuery(open.before) == CUDA_ERROR_NOT_READY;
  CUevent after = record_before(g, stream);
  if (after == nullptr) {
    give_event(g, open.before, true);
    return;
  }
  g.fn_samples.push_back(FnSample{open.before, after, open.fn, exact});
}

void take_fn_samples(Gate& g) {
  while (!g.fn_samples.empty() && cu()->cuEventQuery(g.fn_samples.front().after) == CUDA_SUCCESS) {
    const FnSample s = g.fn_samples.front();
    g.fn_samples.pop_front();
    float ms = 0.0f;
    if (cu()->cuEventElapsedTime(&ms, s.before, s.after) == CUDA_SUCCESS && ms >= 0.0f) {
      // 0 means "not learned": a launch that ran for nothing measurable costs 1 ns
      const auto fresh = static_cast<uint32_t>(std::clamp(ms * 1e6, 1.0, 4e9));
      const uint32_t old = s.fn->ns.load(std::memory_order_relaxed);
      const bool had_exact = s.fn->samples.load(std::memory_order_relaxed) > 0;
      uint32_t cost = old;
      if (s.exact) {
        // exact timings average; the first replaces whatever bound stood in for it
        cost = had_exact ? static_cast<uint32_t>(0.75 * old + 0.25 * fresh) : fresh;
        s.fn->samples.fetch_add(1, std::memory_order_relaxed);
      } else if (!had_exact) {
        // the tightest bound stands in until an exact timing comes: a kernel launched only
        // onto an empty stream is never timed exactly, and is better counted a little long
        // than at the stream's average
        cost = old == 0 ? fresh : std::min(old, fresh);
      }
      s.fn->ns.store(std::max<uint32_t>(1, cost), std::memory_order_relaxed);
    }
    give_event(g, s.before, true);
    give_event(g, s.after, true);
  }
}

double launch_cost_ns(const FnCost* fn, const StreamState& st) {
  const uint32_t ns = fn != nullptr ? fn->ns.load(std::memory_order_relaxed) : 0;
  return ns != 0 ? static_cast<double>(ns) : st.ns_per_launch;
}

}  // namespace gpreempt_driver
