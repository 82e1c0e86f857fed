// The contexts a process makes and destroys, from CUPTI's resource callbacks (called whether
// the launch callbacks sleep or not).
//
// Made: the gate tells the daemon each GPU the process makes a CUDA context on, so that a
// process that drives several (single-process data parallelism in JAX, CuPy or PyTorch's
// DataParallel) is preempted by a more important task on any of them, with no option given.
// The GPU's physical index goes into the control block's `devices` word, and the doorbell
// rings.
//
// Destroyed (cuCtxDestroy, cudaDeviceReset, cuDevicePrimaryCtxReset): the gate forgets the
// context's streams and events before they go, so that it neither queries dead events nor
// takes a new context made at the same address for the old one.
//
// Detached from CUPTI (driver_cupti.cpp), no callback says either: the gate forgets every
// context when it detaches, and its thread looks for the GPUs whose primary context the
// process started (the contexts of PyTorch, JAX, CuPy and the CUDA runtime).
#include <algorithm>
#include <cstdlib>
#include <vector>

#include "driver_gate.h"
#include "visible_devices.h"

namespace gpreempt_driver {

namespace {

// The process has a context on device `ordinal` (as it counts them): its physical GPU into
// the block's devices word, the doorbell rung where that adds one.
void note_device(Gate& g, int ordinal) {
  const int gpu = gpreempt_devices::physical_gpu(ordinal, getenv("CUDA_VISIBLE_DEVICES"));
  if (gpu < 0 || gpu >= 64) {
    return;  // an index the daemon could not be told (a UUID in CUDA_VISIBLE_DEVICES)
  }
  const uint64_t bit = uint64_t{1} << gpu;
  if ((g.devices.fetch_or(bit) & bit) == 0) {
    publish_devices(g);
  }
}

void on_context_created(Gate& g, CUcontext context) {
  uint32_t ordinal = 0;
  if (context != nullptr && cuptiGetDeviceId(context, &ordinal) == CUPTI_SUCCESS) {
    note_device(g, static_cast<int>(ordinal));
  }
}

}  // namespace

void on_context_call(Gate& g, CUpti_CallbackId cbid, const CUpti_ResourceData* data) {
  if (cbid == CUPTI_CBID_RESOURCE_CONTEXT_CREATED) {
    on_context_created(g, data->context);
  } else if (cbid == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING && data->context != nullptr) {
    forget_context(g, data->context);
  }
}

void publish_devices(Gate& g) {
  uint8_t* ctl = g.ctl.load(std::memory_order_acquire);
  const uint64_t bits = g.devices.load();
  if (ctl == nullptr || bits == 0) {
    return;  // written when the block comes (adopt)
  }
  const uint64_t had =
      __atomic_fetch_or(reinterpret_cast<uint64_t*>(ctl + kOffDevices), bits, __ATOMIC_RELEASE);
  if ((had | bits) != had) {
    ring(g);
  }
}

void look_for_devices(Gate& g) {
  const Guard guard;
  int count = 0;
  if (cu()->cuDeviceGetCount(&count) != CUDA_SUCCESS) {
    return;
  }
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    CUdevice device = 0;
    unsigned int flags = 0;
    int active = 0;
    if (cu()->cuDeviceGet(&device, ordinal) == CUDA_SUCCESS &&
        cu()->cuDevicePrimaryCtxGetState(device, &flags, &active) == CUDA_SUCCESS && active != 0) {
      note_device(g, ordinal);
    }
  }
}

void forget_contexts(Gate& g) {
  std::vector<CUcontext> contexts;
  {
    std::lock_guard<std::mutex> lock(g.mu);
    for (const auto& [key, st] : g.streams) {
      contexts.push_back(st.context);
    }
    for (const auto* spares : {&g.spare_events, &g.spare_plain}) {
      for (const auto& [context, events] : *spares) {
        contexts.push_back(context);
      }
    }
  }
  std::sort(contexts.begin(), contexts.end());
  contexts.erase(std::unique(contexts.begin(), contexts.end()), contexts.end());
  for (CUcontext context : contexts) {
    forget_context(g, context);
  }
}

bool enable_context_callbacks(CUpti_SubscriberHandle subscriber) {
  bool ok = true;
  for (CUpti_CallbackId id :
       {CUPTI_CBID_RESOURCE_CONTEXT_CREATED, CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING}) {
    ok = cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE, id) == CUPTI_SUCCESS && ok;
  }
  return ok;
}

}  // namespace gpreempt_driver
