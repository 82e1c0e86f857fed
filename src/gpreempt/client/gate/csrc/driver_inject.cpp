// The driver-level gate's entry points: InitializeInjection (the CUDA driver's tools interface,
// CUDA_INJECTION64_PATH), the CUPTI callback, the thread that sleeps and wakes the gate, and
// the functions the Python client calls through ctypes.
//
// CUPTI allows one callback subscriber per process (driver_cupti.cpp holds it). We take it at
// cuInit; a profiler started later in the process (torch.profiler, Kineto) needs it too: the
// Python client releases it (gpreempt_driver_release) for the profiler's lifetime and takes it
// back afterwards (gpreempt_driver_resume). The control block's driver_gate word says which
// holds, and the daemon backs a gate that does not hold with the driver lock.
#include <dlfcn.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string_view>
#include <thread>

#include "driver_cupti.h"
#include "driver_gate.h"

namespace gpreempt_driver {

Gate& gate() {
  static Gate* g = new Gate();  // never destroyed: callbacks may run during exit
  return *g;
}

namespace {
const CuApi* loaded_api = nullptr;
}  // namespace

const CuApi* cu() { return loaded_api; }

bool cu_load() {
  if (loaded_api != nullptr) {
    return true;
  }
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) {
    return false;
  }
  auto* api = new CuApi();
  bool complete = true;
#define GP_STR2(x) #x
#define GP_STR(x) GP_STR2(x)
#define GP_CU_LOAD(name)                                                         \
  api->name = reinterpret_cast<decltype(api->name)>(dlsym(lib, GP_STR(name))); \
  complete = complete && api->name != nullptr;
  GP_CU_FUNCTIONS(GP_CU_LOAD)
#undef GP_CU_LOAD
  if (!complete) {
    delete api;
    return false;
  }
  loaded_api = api;
  return true;
}

void CUPTIAPI on_driver_call(void* /*userdata*/, CUpti_CallbackDomain domain,
                             CUpti_CallbackId cbid, const void* cbdata) {
  if (gate().exiting.load(std::memory_order_relaxed)) {
    return;
  }
  if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
    on_context_call(gate(), cbid, static_cast<const CUpti_ResourceData*>(cbdata));
    return;
  }
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API) {
    return;
  }
  const auto* data = static_cast<const CUpti_CallbackData*>(cbdata);
  if (cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamDestroy ||
      cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamDestroy_v2) {
    if (data->callbackSite == CUPTI_API_ENTER) {
      forget_stream(*static_cast<const CUstream*>(data->functionParams));
    }
    return;
  }
  if (on_capture_call(gate(), cbid, data)) {
    return;
  }
  if (detach_asked()) {
    if (data->callbackSite == CUPTI_API_EXIT) {
      finish_detach();
    }
    return;  // asleep: its callbacks are on only to detach
  }
  if (data->callbackSite == CUPTI_API_ENTER) {
    before_launch(cbid, data);
  } else {
    after_launch(cbid, data);
  }
}

namespace {

// Asleep this long, a task nothing preempts lets CUPTI go (driver_cupti.cpp); detached, its
// thread looks for GPUs the process started on this often (no context callback tells them).
constexpr int64_t kDetachAfterNs = 1000LL * 1000 * 1000;
constexpr int64_t kDeviceLookNs = 10 * 1000 * 1000;

// The mode the gate should be in now (callback_mode.h).
Mode mode_now(Gate& g, const uint8_t* ctl, int64_t now, Mode mode, int64_t asleep_since) {
  ModeFacts f;
  f.bound = g.cfg.bound;
  f.needs_launches = !g.cfg.bound && launches_tell_activity(g) && load32(ctl, kOffHinted) == 0;
  f.closed = load32(ctl, kOffGateClosed) != 0;
  f.watched_active = watched_active(g.watch.load(std::memory_order_acquire));
  f.kept_awake = now < g.awake_until_ns.load(std::memory_order_relaxed);
  f.sleep_ok = load32(ctl, kOffSleepOk) != 0;
  f.may_pace = g.pacing_on && g.trials.allowed(now) && barriers_hold(g, ctl) &&
               !g.per_thread.load(std::memory_order_relaxed);
  f.devices_known = g.devices.load(std::memory_order_relaxed) != 0;
  f.may_detach = g.detach_on && detach_allowed() &&
                 (mode == Mode::kDetached ||
                  (mode == Mode::kAsleep && now - asleep_since >= kDetachAfterNs));
  return wanted_mode(f);
}

void background() {
  pthread_setname_np(pthread_self(), "gpreempt-drv");
  Gate& g = gate();
  int64_t asleep_since = 0;
  int64_t next_device_look = 0;
  for (;;) {
    uint8_t* ctl = g.ctl.load(std::memory_order_acquire);
    const int64_t now = now_ns();
    g.background_busy.store(true);
    if (g.exiting.load()) {
      g.background_busy.store(false);
      return;  // the driver is being torn down: no more calls into it
    }
    const bool on = ctl != nullptr && driver_state() == kDriverOn;
    Mode mode = current_mode();
    int64_t idle_due = std::numeric_limits<int64_t>::max();
    if (on) {
      discover_streams(g, now);
      asleep_since = mode != Mode::kAsleep ? 0 : asleep_since != 0 ? asleep_since : now;
      Mode want = mode_now(g, ctl, now, mode, asleep_since);
      // asked last, not among the mode's facts: it takes the gate's mutex and reaps marks
      if (want == Mode::kPaced && mode == Mode::kAwake && !may_start_pacing(g)) {
        want = Mode::kAwake;  // not yet: its queue is deep
      }
      if (want == Mode::kDetached || mode == Mode::kDetached || detach_pending()) {
        mode = step_detach(g, ctl, mode, want);
      }
      const Mode to = want == Mode::kDetached ? Mode::kAsleep : want;  // asleep, then detached
      if (mode != Mode::kDetached && to != mode && switch_mode(g, ctl, mode, to)) {
        mode = to;
      }
      if (mode == Mode::kDetached && now >= next_device_look) {
        look_for_devices(g);
        next_device_look = now + kDeviceLookNs;
      }
      idle_due = check_idle(g, now);
      if ((mode == Mode::kAsleep || mode == Mode::kPaced) &&
          asleep_barriers(g, now, mode == Mode::kPaced)) {
        g.trials.failed(now);  // switched back on at the next turn
      }
      if (mode != Mode::kDetached) {
        rise_barriers(g, now);
      }
    }
    verify_barriers(g, on && mode == Mode::kAwake);
    if (on && mode == Mode::kAwake) {
      reap_streams(g);  // after the check, which dates a barrier by the mark before it
    }
    g.background_busy.store(false);
    // an activity that may drop is looked at when due: a server's drop then lags its work by
    // its grace, not by the grace and up to two of these pauses
    const int64_t every = mode == Mode::kAwake ? 250000 : mode == Mode::kPaced ? 50000 : 200000;
    timespec pause{0, static_cast<long>(std::min(every, std::max<int64_t>(idle_due, 20000)))};
    nanosleep(&pause, nullptr);
  }
}

// At exit (registered at cuInit, so it runs before the CUDA runtime's own teardown): the gate
// stops calling the driver, from its thread and from callbacks.
void at_exit() {
  Gate& g = gate();
  g.exiting.store(true);
  for (int i = 0; i < 500 && g.background_busy.load(); ++i) {
    timespec pause{0, 100000};
    nanosleep(&pause, nullptr);
  }
}

void after_fork_in_child() {
  // The child shares the parent's control block mapping but is not the process it describes;
  // CUDA does not work in a forked child anyway.
  gate().ctl.store(nullptr);
}

}  // namespace

}  // namespace gpreempt_driver

using namespace gpreempt_driver;

extern "C" {

// Called by the CUDA driver at cuInit in every process that has CUDA_INJECTION64_PATH.
__attribute__((visibility("default"))) int InitializeInjection() {
  Gate& g = gate();
  if (g.initialized.exchange(true)) {
    return 1;
  }
  pthread_atfork(nullptr, nullptr, after_fork_in_child);
  std::atexit(at_exit);
  const char* pacing = getenv("GPREEMPT_DRIVER_PACED");
  g.pacing_on = pacing != nullptr && std::string_view(pacing) == "1";  // off unless asked
  const char* detaching = getenv("GPREEMPT_DRIVER_DETACH");
  g.detach_on = detaching == nullptr || std::string_view(detaching) != "0";  // on unless not
  const uint32_t s = cu_load() ? take_cupti() : kDriverFailed;
  if (g.ctl.load() == nullptr && getenv("GPREEMPT_TASK_ID") != nullptr) {
    g.cfg = config_from_environment();
    open_own_channel(g);
  }
  publish_state(s);
  std::thread(background).detach();
  return 1;
}

// The Python client hands its control block over before CUDA starts: 1 if taken, 0 if the gate
// already has a block (its own channel, opened at cuInit). The gate maps the block itself, and
// never unmaps it: its page stays registered for the GPU's barriers, and a launch at exit, after
// the interpreter let go of its own mapping, still finds it.
__attribute__((visibility("default"))) int gpreempt_driver_adopt(
    int memfd, int doorbell, int bound, int auto_activity, int torch_gate, double barrier_us,
    double window_ms, double idle_grace_ms) {
  Gate& g = gate();
  const Adopted adopted =
      adopt_block(g, memfd, doorbell, bound, auto_activity, torch_gate, idle_grace_ms, [&] {
        g.cfg.barrier_us = barrier_us;
        g.cfg.window_ms = window_ms;
      });
  if (adopted != Adopted::kMapped) {
    return adopted == Adopted::kAgain ? 1 : 0;
  }
  if (g.initialized.load()) {
    publish_state(driver_state());
  }
  publish_devices(g);
  return 1;
}

// The watched tasks' control blocks and the version of the daemon's list (launch_hold.h).
__attribute__((visibility("default"))) void gpreempt_driver_set_watch(const uintptr_t* blocks,
                                                                       size_t n,
                                                                       uint32_t version) {
  publish_watch(gate(), blocks, n, version);
}

// PyTorch's operator gate handed the process's activity over: 1 if the launches tell it now.
__attribute__((visibility("default"))) int gpreempt_driver_take_activity() {
  return take_activity(gate()) ? 1 : 0;
}

// Hands CUPTI to a profiler: the gate holds nothing until gpreempt_driver_resume.
__attribute__((visibility("default"))) uint32_t gpreempt_driver_release() {
  return release_cupti();
}

// Takes CUPTI back after a profiler; the state says whether it could.
__attribute__((visibility("default"))) uint32_t gpreempt_driver_resume() { return resume_cupti(); }

__attribute__((visibility("default"))) uint32_t gpreempt_driver_state() { return driver_state(); }

// The mode of its callbacks (callback_mode.h): 0 awake, 1 asleep, 2 paced, 3 detached.
__attribute__((visibility("default"))) uint32_t gpreempt_driver_mode() {
  return static_cast<uint32_t>(current_mode());
}

// The version of the watch list the gate holds now (0: none, or incomplete).
__attribute__((visibility("default"))) uint32_t gpreempt_driver_watch_version() {
  return watch_version(gate());
}

__attribute__((visibility("default"))) int gpreempt_driver_initialized() {
  return gate().initialized.load() ? 1 : 0;
}

}  // extern "C"
