// A tools library that does one part of what the driver-level gate does with CUPTI, chosen by
// GPREEMPT_PROBE: whether that part alone slows another program's work (server_gated.py's
// modes probe-*). Loaded through CUDA_INJECTION64_PATH; its callback does nothing.
//   none: InitializeInjection returns at once; subscribe: cuptiSubscribe, no callback on;
//   resource: and the context callbacks; graph: and the driver API's cuGraphLaunch (the gate
//   has it on while awake); driver: and every driver API callback (cuptiEnableDomain).
//   launches: cuptiSubscribe and the kernel launches' driver API callbacks alone, the floor of
//   what any gate that sees launches through CUPTI costs each (launch_cost.py's config cupti).
//   unsubscribe, finalize, resubscribe: as subscribe; then, when the program calls
//   gpreempt_probe_detach() (server_gated.py's child does, once warm): cuptiUnsubscribe;
//   and cuptiFinalize (CUPTI detached from the process); or cuptiSubscribe again.
#include <cupti.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace {
CUpti_SubscriberHandle subscriber = nullptr;
void CUPTIAPI nothing(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}
}  // namespace

extern "C" int InitializeInjection() {
  const char* mode = std::getenv("GPREEMPT_PROBE");
  const bool detaching = mode != nullptr && (std::strcmp(mode, "unsubscribe") == 0 ||
                                             std::strcmp(mode, "finalize") == 0 ||
                                             std::strcmp(mode, "resubscribe") == 0);
  const int level = mode == nullptr                         ? 0
                    : detaching                           ? 1
                    : std::strcmp(mode, "subscribe") == 0 ? 1
                    : std::strcmp(mode, "resource") == 0  ? 2
                    : std::strcmp(mode, "graph") == 0     ? 3
                    : std::strcmp(mode, "driver") == 0    ? 4
                    : std::strcmp(mode, "launches") == 0  ? 5
                                                          : 0;
  if (level == 0 || cuptiSubscribe(&subscriber, nothing, nullptr) != CUPTI_SUCCESS) {
    return 1;
  }
  if (level == 5) {
    for (CUpti_CallbackId id :
         {CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
          CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz}) {
      cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id);
    }
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

// The detaching modes' second step; returns the first CUPTI error, 0 when all succeeded.
extern "C" int gpreempt_probe_detach() {
  const char* mode = std::getenv("GPREEMPT_PROBE");
  if (mode == nullptr || subscriber == nullptr) {
    return -1;
  }
  CUptiResult rc = cuptiUnsubscribe(subscriber);
  subscriber = nullptr;
  if (rc == CUPTI_SUCCESS && std::strcmp(mode, "finalize") == 0) {
    rc = cuptiFinalize();
  } else if (rc == CUPTI_SUCCESS && std::strcmp(mode, "resubscribe") == 0) {
    rc = cuptiSubscribe(&subscriber, nothing, nullptr);
  }
  return static_cast<int>(rc);
}
