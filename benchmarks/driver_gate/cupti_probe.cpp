// A tools library that does one part of what the driver-level gate does with CUPTI, chosen by
// GPREEMPT_PROBE: whether that part alone slows another program's work (server_gated.py's
// modes probe-*). Loaded through CUDA_INJECTION64_PATH; its callback does nothing.
//   none: InitializeInjection returns at once; subscribe: cuptiSubscribe, no callback on;
//   resource: and the context callbacks; graph: and the driver API's cuGraphLaunch (the gate
//   has it on while awake); driver: and every driver API callback (cuptiEnableDomain).
#include <cupti.h>

#include <cstdlib>
#include <cstring>

namespace {
CUpti_SubscriberHandle subscriber = nullptr;
void CUPTIAPI nothing(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}
}  // namespace

extern "C" int InitializeInjection() {
  const char* mode = std::getenv("GPREEMPT_PROBE");
  const int level = mode == nullptr                         ? 0
                    : std::strcmp(mode, "subscribe") == 0 ? 1
                    : std::strcmp(mode, "resource") == 0  ? 2
                    : std::strcmp(mode, "graph") == 0     ? 3
                    : std::strcmp(mode, "driver") == 0    ? 4
                                                          : 0;
  if (level == 0 || cuptiSubscribe(&subscriber, nothing, nullptr) != CUPTI_SUCCESS) {
    return 1;
  }
  if (level >= 2) {
    cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE,
                        CUPTI_CBID_RESOURCE_CONTEXT_CREATED);
  }
  if (level >= 3) {
    cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API,
                        CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch);
    cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API,
                        CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz);
  }
  if (level >= 4) {
    cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
  }
  return 1;
}
