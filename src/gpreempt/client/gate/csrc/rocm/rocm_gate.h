// The launch gate for HIP programs on ROCm: what its two files share.
//
// rocprofiler-sdk loads this library as a tool (ROCP_TOOL_LIBRARIES, or any loaded library that
// exports rocprofiler_configure) when the HIP runtime initializes. Its callback tracing of the
// HIP runtime API then calls the gate on the application's thread before every kernel launch,
// graph launch and asynchronous copy or memset (ROCPROFILER_CALLBACK_PHASE_ENTER), whatever
// issued it: PyTorch, Triton, a C++ program. The gate does there what the CUDA driver-level
// gate (../driver_gate.h) does at its CUPTI callback, without its stream barriers:
//   * rocm_hold.cpp: the control block (adopted from the Python client, same functions and
//     signatures as the CUDA gate), counting launches, waiting while the gate word says closed
//     (or a watched, more important task is active), activity for tasks that preempt others:
//     what ../launch_hold.h does for both gates, with the HIP gate's rule for when to wait;
//   * rocm_gate.cpp: rocprofiler_configure, the tool's context and its callback.
// It makes no HIP call itself, so it needs no HIP library, only the rocprofiler-sdk headers.
#pragma once

#include <dlfcn.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "../control_layout.h"
#include "../gate_words.h"
#include "../launch_hold.h"

namespace gpreempt_rocm {

using namespace gpreempt_layout;
using namespace gpreempt_words;

struct Gate : HoldState<HoldConfig> {
  std::atomic<uint32_t> state{kDriverNone};
  std::atomic<bool> background_started{false};
};

Gate& gate();


// The state the control block's driver_gate word shows (kDriverOn once the tool's callback is
// configured and its context started, kDriverFailed where rocprofiler refused).
void publish_state(uint32_t state);
// Called at the enter phase of every held HIP call, on the calling thread: counts it, waits
// while the gate is closed, publishes activity.
void before_launch();
// The thread that drops auto_active once the process launched nothing for the grace time.
void start_background();


}  // namespace gpreempt_rocm
