// CUPTI's one subscriber as the driver-level gate holds it (driver_cupti.cpp): which of its
// callbacks are on (the gate's mode, callback_mode.h), letting CUPTI go while nothing needs
// it and taking it back, and giving it to a profiler. Every function takes its own mutex.
#pragma once

#include <cupti.h>

#include <cstdint>

#include "driver_gate.h"

namespace gpreempt_driver {

// The gate's callback, for every call CUPTI reports (driver_inject.cpp).
void CUPTIAPI on_driver_call(void* userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                             const void* cbdata);

// At cuInit: subscribes, every callback on; the driver_gate state it gives.
uint32_t take_cupti();
// The state published last (kDriverOn, ...), and the mode the callbacks are in.
uint32_t driver_state();
Mode current_mode();

// Switches to `want` (false where CUPTI would not): callbacks, word, asleep marks ended.
bool switch_mode(Gate& g, uint8_t* ctl, Mode from, Mode want);

// Detaching: whether it may be tried (it never failed), whether a step of it is under way
// (asked, done or failed, and not yet taken up by step_detach), and whether the gate's thread
// asked for it (read by every callback).
bool detach_allowed();
bool detach_pending();
bool detach_asked();
// In a held call's callback, at its exit, while detach_asked(): detaches CUPTI.
void finish_detach();
// A step of detaching or attaching, where `want` or `mode` is detached or detach_pending();
// the gate's mode after it.
Mode step_detach(Gate& g, uint8_t* ctl, Mode mode, Mode want);

// Hands CUPTI to a profiler until resume_cupti; each returns the state after.
uint32_t release_cupti();
uint32_t resume_cupti();

}  // namespace gpreempt_driver
