// The HIP launch gate's work on each launch (count, wait while closed, activity:
// ../launch_hold.h), the thread that drops its activity, and the functions the Python client
// calls through ctypes, with the CUDA driver-level gate's names and signatures
// (../driver_inject.cpp), so gpreempt.client.gate.driver drives either.
#include <pthread.h>
#include <time.h>

#include <thread>

#include "rocm_gate.h"

namespace gpreempt_rocm {

Gate& gate() {
  static Gate* g = new Gate();  // never destroyed: callbacks may run during exit
  return *g;
}

namespace {

void ring(Gate& g) { ring_doorbell(g.doorbell); }

// The rule of the operator gate (gpreempt.control.released_by_watch): a gate closed only while
// watch list V is active goes on once none is. With no stream barriers on HIP, the CPU always
// stops for active watched tasks.
bool must_wait(const Gate& g, uint32_t word, const WatchList* w) {
  if (word == 0 || closed_while_watched(word, w)) {
    return g.cfg.bound && watched_active(w);
  }
  return true;
}

// auto_active drops once the process launched nothing for the grace time. The gate makes no
// HIP call, so it cannot tell when the GPU finished the last launch: the grace time starts at
// the launch, not at its completion.
void background() {
  pthread_setname_np(pthread_self(), "gpreempt-hip");
  Gate& g = gate();
  for (;;) {
    uint8_t* ctl = g.ctl.load(std::memory_order_acquire);
    if (ctl != nullptr && g.active.load() != 0) {
      const int64_t grace_ns = static_cast<int64_t>(g.cfg.idle_grace_ms * 1e6);
      if (now_ns() - g.last_launch_ns.load(std::memory_order_relaxed) > grace_ns &&
          g.active.exchange(0) != 0) {
        set_activity_word(ctl, kOffAutoActive, 0);
        ring(g);
      }
    }
    timespec pause{0, 250000};
    nanosleep(&pause, nullptr);
  }
}

void after_fork_in_child() {
  // The child shares the parent's mapping but is not the process the block describes.
  gate().ctl.store(nullptr);
  gate().background_started.store(false);
}

}  // namespace

void start_background() {
  Gate& g = gate();
  if (!g.background_started.exchange(true)) {
    static const bool registered = (pthread_atfork(nullptr, nullptr, after_fork_in_child), true);
    (void)registered;
    std::thread(background).detach();
  }
}

void publish_state(uint32_t s) {
  Gate& g = gate();
  g.state.store(s);
  uint8_t* ctl = g.ctl.load(std::memory_order_acquire);
  if (ctl != nullptr) {
    store32(ctl, kOffDriverGate, s);
    if (s == kDriverOn && !g.cfg.torch_gate && g.cfg.bound) {
      store32(ctl, kOffInstalled, 1);
    }
  }
}

void before_launch() {
  Gate& g = gate();
  uint8_t* ctl = g.ctl.load(std::memory_order_acquire);
  if (ctl == nullptr) {
    return;
  }
  hold_launch(g, ctl, [&g](uint32_t word, const WatchList* w) { return must_wait(g, word, w); });
}

}  // namespace gpreempt_rocm

using namespace gpreempt_rocm;

extern "C" {

// The Python client hands its control block over: 1 if taken, 0 if not (a bad memfd, or the
// gate holds another block). The gate maps the block itself and never unmaps it. barrier_us
// and window_ms are taken for the CUDA gate's signature; HIP has no stream barriers here.
__attribute__((visibility("default"))) int gpreempt_driver_adopt(
    int memfd, int doorbell, int bound, int auto_activity, int torch_gate, double /*barrier_us*/,
    double /*window_ms*/, double idle_grace_ms) {
  Gate& g = gate();
  const Adopted adopted = adopt_block(g, memfd, doorbell, bound, auto_activity, torch_gate,
                                      idle_grace_ms, [] {});
  if (adopted != Adopted::kMapped) {
    return adopted == Adopted::kAgain ? 1 : 0;
  }
  publish_state(g.state.load());
  if (g.cfg.auto_activity) {
    start_background();
  }
  return 1;
}

// The watched tasks' control blocks and the version of the daemon's list (../launch_hold.h).
__attribute__((visibility("default"))) void gpreempt_driver_set_watch(const uintptr_t* blocks,
                                                                       size_t n,
                                                                       uint32_t version) {
  publish_watch(gate(), blocks, n, version);
}

// PyTorch's operator gate handed the process's activity over: 1 if the launches tell it now.
__attribute__((visibility("default"))) int gpreempt_driver_take_activity() {
  return take_activity(gate()) ? 1 : 0;
}

// rocprofiler-sdk lets several tools trace the same process (a profiler needs nothing from
// the gate): releasing and resuming change nothing and say the state.
__attribute__((visibility("default"))) uint32_t gpreempt_driver_release() {
  return gate().state.load();
}
__attribute__((visibility("default"))) uint32_t gpreempt_driver_resume() {
  return gate().state.load();
}

__attribute__((visibility("default"))) uint32_t gpreempt_driver_state() {
  return gate().state.load();
}

__attribute__((visibility("default"))) uint32_t gpreempt_driver_watch_version() {
  return watch_version(gate());
}

// 1 once rocprofiler configured the gate's callback (whatever came of it).
__attribute__((visibility("default"))) int gpreempt_driver_initialized() {
  return gate().state.load() != kDriverNone ? 1 : 0;
}

}  // extern "C"
