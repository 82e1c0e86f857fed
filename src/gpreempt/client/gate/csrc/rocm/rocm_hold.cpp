// The HIP launch gate's work on each launch (count, wait while closed, activity) and the
// functions the Python client calls through ctypes, with the CUDA driver-level gate's names and
// signatures (../driver_inject.cpp), so gpreempt.client.gate.driver drives either.
#include <linux/futex.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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

// Spin briefly, then sleep on the word (the daemon wakes the futex when it opens the gate);
// watched words are polled.
void wait_open(Gate& g, uint8_t* ctl) {
  NoGil nogil;
  auto* word = reinterpret_cast<uint32_t*>(ctl + kOffGateClosed);
  const int64_t start = now_ns();
  add64(ctl, kOffDriverWaits, 1);
  for (int spins = 0;;) {
    const uint32_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    const WatchList* list = g.watch.load(std::memory_order_acquire);
    if (!must_wait(g, seen, list)) {
      break;
    }
    if (spins < 256) {
      ++spins;
      continue;
    }
    if (seen != 0 && !closed_while_watched(seen, list)) {
      timespec timeout{0, 1000000};
      syscall(SYS_futex, word, FUTEX_WAIT, seen, &timeout, nullptr, 0);
    } else {
      timespec poll{0, 30000};
      nanosleep(&poll, nullptr);
    }
  }
  add64(ctl, kOffDriverWaitNs, static_cast<uint64_t>(now_ns() - start));
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
        store32(ctl, kOffAutoActive, 0);
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
  add64(ctl, kOffDriverLaunches, 1);
  const uint32_t word = load32(ctl, kOffGateClosed);
  if (word != 0 || g.watch.load(std::memory_order_relaxed) != nullptr) {
    if (must_wait(g, word, g.watch.load(std::memory_order_acquire))) {
      wait_open(g, ctl);
    }
  }
  if (g.cfg.auto_activity && !g.cfg.torch_gate) {
    g.last_launch_ns.store(now_ns(), std::memory_order_relaxed);
    if (g.active.exchange(1) == 0) {
      store32(ctl, kOffAutoActive, 1);
      ring(g);
    }
  }
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
  struct stat st {};
  if (fstat(memfd, &st) != 0 || st.st_size < static_cast<off_t>(kSize)) {
    return 0;
  }
  if (g.ctl.load() != nullptr && g.adopted.load() && g.adopted_inode == st.st_ino) {
    g.cfg.torch_gate = g.cfg.torch_gate || torch_gate != 0;
    return 1;
  }
  if (g.ctl.load() != nullptr) {
    return 0;
  }
  void* mapped = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (mapped == MAP_FAILED) {
    return 0;
  }
  g.cfg.bound = bound != 0;
  g.cfg.auto_activity = auto_activity != 0;
  g.cfg.torch_gate = torch_gate != 0;
  g.cfg.idle_grace_ms = idle_grace_ms;
  g.doorbell = dup(doorbell);
  g.adopted_inode = st.st_ino;
  g.adopted.store(true);
  g.ctl.store(static_cast<uint8_t*>(mapped), std::memory_order_release);
  publish_state(g.state.load());
  if (g.cfg.auto_activity) {
    start_background();
  }
  return 1;
}

// The watched tasks' control blocks (read-only mappings the client keeps), and the version of
// the daemon's list. A list is never freed: a launch may be reading it.
__attribute__((visibility("default"))) void gpreempt_driver_set_watch(const uintptr_t* blocks,
                                                                       size_t n,
                                                                       uint32_t version) {
  auto* list = new WatchList();
  list->n = n < kMaxWatched ? n : kMaxWatched;
  for (size_t i = 0; i < list->n; ++i) {
    list->blocks[i] = reinterpret_cast<const uint8_t*>(blocks[i]);
  }
  list->version = n <= kMaxWatched ? version : 0;
  gate().watch.store(n == 0 ? nullptr : list, std::memory_order_release);
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
  const WatchList* list = gate().watch.load(std::memory_order_acquire);
  return list == nullptr ? 0 : list->version;
}

// 1 once rocprofiler configured the gate's callback (whatever came of it).
__attribute__((visibility("default"))) int gpreempt_driver_initialized() {
  return gate().state.load() != kDriverNone ? 1 : 0;
}

}  // extern "C"
