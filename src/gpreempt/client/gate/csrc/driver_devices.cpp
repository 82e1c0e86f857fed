// The GPUs a process drives: the gate tells the daemon each GPU the process makes a CUDA
// context on, so that a process that drives several (single-process data parallelism in JAX,
// CuPy or PyTorch's DataParallel) is preempted by a more important task on any of them, with no
// option given. CUPTI calls on_context_created for every context made after InitializeInjection,
// whether the launch callbacks sleep or not; the GPU's physical index goes into the control
// block's `devices` word, and the doorbell rings.
#include <cstdlib>

#include "driver_gate.h"
#include "visible_devices.h"

namespace gpreempt_driver {

void on_context_created(Gate& g, CUcontext context) {
  uint32_t ordinal = 0;
  if (context == nullptr || cuptiGetDeviceId(context, &ordinal) != CUPTI_SUCCESS) {
    return;
  }
  const int gpu = gpreempt_devices::physical_gpu(static_cast<int>(ordinal),
                                                 getenv("CUDA_VISIBLE_DEVICES"));
  if (gpu < 0) {
    return;  // an index the daemon could not be told (a UUID in CUDA_VISIBLE_DEVICES)
  }
  const uint64_t bit = uint64_t{1} << gpu;
  if ((g.devices.fetch_or(bit) & bit) == 0) {
    publish_devices(g);
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

bool enable_device_callbacks(CUpti_SubscriberHandle subscriber) {
  return cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE,
                             CUPTI_CBID_RESOURCE_CONTEXT_CREATED) == CUPTI_SUCCESS;
}

}  // namespace gpreempt_driver
