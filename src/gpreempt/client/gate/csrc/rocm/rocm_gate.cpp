// The HIP launch gate's rocprofiler-sdk front-end: rocprofiler_configure, the tool's context,
// and the callback tracing of the HIP runtime API's launch operations.
//
// rocprofiler-sdk (registration.h) calls rocprofiler_configure of every tool library when a
// runtime registers with it; the initialize function of the returned config is where contexts
// and services may be configured (rocprofiler_configure_callback_tracing_service answers
// ROCPROFILER_STATUS_ERROR_CONFIGURATION_LOCKED anywhere else). The callback then runs
// synchronously on the application's thread, before (ENTER) and after (EXIT) each traced call
// (callback_tracing.h), so blocking at ENTER holds the launch.
#include <rocprofiler-sdk/registration.h>
#include <rocprofiler-sdk/rocprofiler.h>

#include <cstddef>

#include "rocm_gate.h"

namespace gpreempt_rocm {
namespace {

// The HIP calls the gate holds: every way a HIP program queues work on a GPU
// (rocprofiler-sdk/hip/runtime_api_id.h). hipLaunchKernel covers <<<...>>> launches (the
// compiler's stub calls it); Triton and other JITs use the module launches.
#define GP_HIP(name) ROCPROFILER_HIP_RUNTIME_API_ID_##name
constexpr rocprofiler_tracing_operation_t kHeld[] = {
    GP_HIP(hipLaunchKernel),
    GP_HIP(hipLaunchKernel_spt),
    GP_HIP(hipModuleLaunchKernel),
    GP_HIP(hipExtLaunchKernel),
    GP_HIP(hipExtModuleLaunchKernel),
    GP_HIP(hipHccModuleLaunchKernel),
    GP_HIP(hipLaunchCooperativeKernel),
    GP_HIP(hipLaunchCooperativeKernel_spt),
    GP_HIP(hipLaunchCooperativeKernelMultiDevice),
    GP_HIP(hipModuleLaunchCooperativeKernel),
    GP_HIP(hipModuleLaunchCooperativeKernelMultiDevice),
    GP_HIP(hipExtLaunchMultiKernelMultiDevice),
    GP_HIP(hipGraphLaunch),
    GP_HIP(hipGraphLaunch_spt),
    GP_HIP(hipMemcpyAsync),
    GP_HIP(hipMemcpyAsync_spt),
    GP_HIP(hipMemcpyHtoDAsync),
    GP_HIP(hipMemcpyDtoHAsync),
    GP_HIP(hipMemcpyDtoDAsync),
    GP_HIP(hipMemcpy2DAsync),
    GP_HIP(hipMemcpy2DAsync_spt),
    GP_HIP(hipMemcpy3DAsync),
    GP_HIP(hipMemcpy3DAsync_spt),
    GP_HIP(hipMemcpyPeerAsync),
    GP_HIP(hipMemsetAsync),
    GP_HIP(hipMemsetAsync_spt),
    GP_HIP(hipMemsetD8Async),
    GP_HIP(hipMemsetD16Async),
    GP_HIP(hipMemsetD32Async),
    GP_HIP(hipMemset2DAsync),
    GP_HIP(hipMemset2DAsync_spt),
    GP_HIP(hipMemset3DAsync),
    GP_HIP(hipMemset3DAsync_spt),
};
#undef GP_HIP

rocprofiler_context_id_t context{0};

void on_hip_call(rocprofiler_callback_tracing_record_t record, rocprofiler_user_data_t* /*data*/,
                 void* /*arg*/) {
  if (record.kind == ROCPROFILER_CALLBACK_TRACING_HIP_RUNTIME_API &&
      record.phase == ROCPROFILER_CALLBACK_PHASE_ENTER) {
    before_launch();
  }
}

// The tool's initialize function: one context, the HIP runtime API's launch operations traced,
// the context started. 0 = keep the tool; a failure is published (driver_gate = failed) and
// the tool stays loaded with nothing traced.
int initialize(rocprofiler_client_finalize_t /*finalize*/, void* /*tool_data*/) {
  const bool ok =
      rocprofiler_create_context(&context) == ROCPROFILER_STATUS_SUCCESS &&
      rocprofiler_configure_callback_tracing_service(
          context, ROCPROFILER_CALLBACK_TRACING_HIP_RUNTIME_API, kHeld,
          sizeof(kHeld) / sizeof(kHeld[0]), on_hip_call, nullptr) == ROCPROFILER_STATUS_SUCCESS &&
      rocprofiler_start_context(context) == ROCPROFILER_STATUS_SUCCESS;
  publish_state(ok ? kDriverOn : kDriverFailed);
  return 0;
}

void finalize(void* /*tool_data*/) {
  // The runtime shuts down: launches are no longer traced.
  publish_state(kDriverNone);
}

}  // namespace
}  // namespace gpreempt_rocm

extern "C" {

// Called by rocprofiler-sdk once per tool library when a runtime registers with it.
__attribute__((visibility("default"))) rocprofiler_tool_configure_result_t* rocprofiler_configure(
    uint32_t /*version*/, const char* /*runtime_version*/, uint32_t /*priority*/,
    rocprofiler_client_id_t* client_id) {
  if (client_id != nullptr) {
    client_id->name = "gpreempt";
  }
  static rocprofiler_tool_configure_result_t config{
      sizeof(rocprofiler_tool_configure_result_t), &gpreempt_rocm::initialize,
      &gpreempt_rocm::finalize, nullptr};
  return &config;
}

}  // extern "C"
