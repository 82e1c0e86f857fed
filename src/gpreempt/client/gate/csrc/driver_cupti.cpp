// CUPTI's one subscriber as the driver-level gate holds it (driver_cupti.h).
//
// Letting CUPTI go (callback_mode.h says when). A subscriber slows every graph launch of the
// process on the host, callbacks on or off (a ResNet-50 graph's cuGraphLaunch on an H200:
// 134-190 us instead of 17-23), and cuptiUnsubscribe does not undo it; cuptiFinalize, which
// detaches CUPTI from the process, does (benchmarks/driver_gate/server_gated.py, its results in
// benchmarks/driver_gate/results/h200/server_gated/). The gate's thread asks
// (the held calls' callbacks on); the next one detaches at its exit, where CUPTI wants
// cuptiFinalize called. Where that fails, the gate never asks again. It subscribes again when
// it must wake, and where the Python client hands CUPTI to a profiler (release_cupti).
#include "driver_cupti.h"

#include <atomic>
#include <mutex>

#include "driver_callbacks.h"

namespace gpreempt_driver {

namespace {

// The subscriber and the enabled callbacks. Never destroyed: the gate's thread may still take
// it while the process exits.
std::mutex& cupti_mu = *new std::mutex();
CUpti_SubscriberHandle subscriber = nullptr;
std::atomic<uint32_t> state{kDriverNone};
std::atomic<Mode> current{Mode::kAwake};  // subscribe() switches every callback on
// Letting go: none under way, asked by the gate's thread, done by a callback (not yet taken up
// by the thread), failed (its callbacks not yet off again), given up for good.
enum class Detach { kNone, kAsked, kDone, kFailed, kGaveUp };
std::atomic<Detach> detach{Detach::kNone};

// cupti_mu held.
bool enable_held(bool on) {
  bool ok = true;
  for (CUpti_CallbackId id : kHeld) {
    ok = cuptiEnableCallback(on ? 1 : 0, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id) ==
             CUPTI_SUCCESS &&
         ok;
  }
  return ok;
}

// cupti_mu held.
uint32_t subscribe() {
  const CUptiResult r = cuptiSubscribe(&subscriber, on_driver_call, nullptr);
  if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
    subscriber = nullptr;
    return kDriverUnavailable;
  }
  if (r != CUPTI_SUCCESS) {
    subscriber = nullptr;
    return kDriverFailed;
  }
  bool ok = true;
  for (CUpti_CallbackId id : kStreamGone) {
    ok = cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id) == CUPTI_SUCCESS && ok;
  }
  ok = enable_capture_callbacks(subscriber) && ok;
  ok = enable_context_callbacks(subscriber) && ok;
  ok = enable_held(true) && ok;
  current.store(Mode::kAwake);
  if (uint8_t* ctl = gate().ctl.load(std::memory_order_acquire); ctl != nullptr) {
    store32(ctl, kOffDriverAsleep, static_cast<uint32_t>(Mode::kAwake));
  }
  if (!ok) {
    cuptiUnsubscribe(subscriber);
    subscriber = nullptr;
    return kDriverFailed;
  }
  return kDriverOn;
}

}  // namespace

uint32_t take_cupti() {
  std::lock_guard<std::mutex> lock(cupti_mu);
  return subscribe();
}

uint32_t driver_state() { return state.load(); }

Mode current_mode() { return current.load(); }

// Switches to `want` (false where CUPTI would not): callbacks, word, asleep marks ended.
bool switch_mode(Gate& g, uint8_t* ctl, Mode from, Mode want) {
  {
    std::lock_guard<std::mutex> lock(cupti_mu);
    if (subscriber == nullptr || current.load() != from) {
      return false;  // released, or taken back (every callback on) since `from` was read
    }
    if ((from == Mode::kAwake) != (want == Mode::kAwake) && !enable_held(want == Mode::kAwake)) {
      return false;
    }
    current.store(want);
    store32(ctl, kOffDriverAsleep, static_cast<uint32_t>(want));
  }
  end_asleep_marks(g);
  return true;
}

Mode step_detach(Gate& g, uint8_t* ctl, Mode mode, Mode want) {
  {
    std::lock_guard<std::mutex> lock(cupti_mu);
    if (state.load() != kDriverOn || current.load() != mode) {
      return current.load();  // released to a profiler, or taken back, meanwhile
    }
    Detach d = detach.load();
    if (mode == Mode::kDetached) {
      if (want == Mode::kDetached) {
        return mode;
      }
      // it must wake: every callback on; a profiler of the program's own may hold CUPTI now
      const uint32_t s = subscribe();
      detach.store(Detach::kNone);
      publish_state(s == kDriverUnavailable ? kDriverReleased : s);
      return current.load();
    }
    if (d == Detach::kFailed || (want != Mode::kDetached && d == Detach::kAsked &&
                                 detach.compare_exchange_strong(d, Detach::kNone))) {
      if (mode != Mode::kAwake) {
        enable_held(false);  // the ask's callbacks off again
      }
      if (d == Detach::kFailed) {
        detach.store(Detach::kGaveUp);
      }
      return mode;
    }
    if (want != Mode::kDetached || mode != Mode::kAsleep) {
      return mode;  // asleep first (switch_mode)
    }
    if (d == Detach::kNone) {
      detach.store(Detach::kAsked);
      if (!enable_held(true)) {
        detach.store(Detach::kFailed);  // cleaned up at the next turn
      }
      return mode;
    }
    if (d != Detach::kDone) {
      return mode;
    }
    current.store(Mode::kDetached);
    store32(ctl, kOffDriverAsleep, static_cast<uint32_t>(Mode::kDetached));
  }
  // No callback tells it which streams and contexts go from now: it knows none. A capture
  // begun meanwhile goes uncounted: the gate asks each stream from now.
  forget_contexts(g);
  g.captures_counted.store(false);
  return Mode::kDetached;
}

bool detach_allowed() {
  const Detach d = detach.load();
  return d != Detach::kFailed && d != Detach::kGaveUp;
}

bool detach_pending() {
  const Detach d = detach.load();
  return d != Detach::kNone && d != Detach::kGaveUp;
}

bool detach_asked() { return detach.load(std::memory_order_relaxed) == Detach::kAsked; }

void finish_detach() {
  std::unique_lock<std::mutex> lock(cupti_mu, std::try_to_lock);
  if (lock.owns_lock() && detach.load() == Detach::kAsked) {  // else the next call does
    const bool done = cuptiFinalize() == CUPTI_SUCCESS;
    if (done) {
      subscriber = nullptr;
    }
    detach.store(done ? Detach::kDone : Detach::kFailed);
  }
}

uint32_t release_cupti() {
  std::lock_guard<std::mutex> lock(cupti_mu);
  const Detach d = detach.load();
  if (subscriber != nullptr || current.load() == Mode::kDetached || d == Detach::kDone) {
    if (subscriber == nullptr) {
      // Detached, CUPTI still refused another library's subscriber (cuptiSubscribe from the
      // program itself read CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED on an H200): it is
      // taken and let go from here, as the gate of a task that never detached does.
      subscribe();
    }
    if (subscriber != nullptr) {
      cuptiUnsubscribe(subscriber);
    }
    subscriber = nullptr;
    if (d == Detach::kAsked || d == Detach::kDone) {
      detach.store(Detach::kNone);  // subscribed again at resume
    }
    {
      // a capture the profiler's time begins goes uncounted: the gate asks each stream from now
      std::lock_guard<std::mutex> gate_lock(gate().mu);
      gate().captures_counted.store(false);
    }
    publish_state(kDriverReleased);
  }
  return state.load();
}

uint32_t resume_cupti() {
  std::lock_guard<std::mutex> lock(cupti_mu);
  if (subscriber == nullptr && gate().initialized.load()) {
    const uint32_t s = subscribe();
    publish_state(s == kDriverUnavailable ? kDriverReleased : s);
  }
  return state.load();
}

void publish_state(uint32_t s) {
  if (s == kDriverOn && !gate().barriers_ok.load()) {
    s = kDriverFailed;  // a barrier failed, for good: it cannot hold what the process queued
  }
  state.store(s);
  uint8_t* ctl = gate().ctl.load(std::memory_order_acquire);
  if (ctl != nullptr) {
    store32(ctl, kOffDriverGate, s);
    if (s == kDriverOn && !gate().cfg.torch_gate && gate().cfg.bound) {
      store32(ctl, kOffInstalled, 1);
    }
  }
}

}  // namespace gpreempt_driver
