// What both native launch gates do for a launch on the launching thread, before it reaches the
// GPU (the CUDA driver-level gate at its CUPTI callback, the HIP launch gate at rocprofiler-sdk's
// enter callback): count it, wait while the gate is closed or a watched task is active, and
// publish the process's activity; and how each takes the Python client's control block and
// watch list. Header-only, as gate_words.h: the two gates are separate libraries, each a
// HoldState of its own settings.
#pragma once

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "gate_words.h"

namespace gpreempt_words {

// The settings both gates take from the Python client (gpreempt_driver_adopt); the CUDA gate
// adds its barriers' and window's.
struct HoldConfig {
  bool bound = true;           // may be preempted: waits for watched tasks too
  bool auto_activity = false;  // publish auto_active from the launches (tasks that preempt)
  bool torch_gate = false;     // PyTorch's operator gate also runs here (it publishes activity)
  double idle_grace_ms = 2.0;  // quiet time before auto_active drops
};

// What both gates keep to hold a process's launches: its control block and the watched
// tasks', and the activity its launches tell.
template <class Config>
struct HoldState {
  std::atomic<uint8_t*> ctl{nullptr};
  int doorbell = -1;
  Config cfg;
  std::atomic<const WatchList*> watch{nullptr};
  std::atomic<bool> adopted{false};  // the block is the Python client's
  uint64_t adopted_inode = 0;        // its memfd's inode
  std::atomic<int64_t> last_launch_ns{0};
  std::atomic<uint32_t> active{0};   // auto_active as this process last set it
  // PyTorch's operator gate handed activity over (take_activity): the launches tell it
  std::atomic<bool> activity_taken{false};
};

// Whether this process's launches tell its activity: a task that detects it, where PyTorch's
// operator gate does not (none runs here, or it handed activity over because the process also
// runs a framework whose launches that gate never sees: JAX, CuPy, ...).
template <class G>
bool launches_tell_activity(const G& g) {
  return g.cfg.auto_activity &&
         (!g.cfg.torch_gate || g.activity_taken.load(std::memory_order_relaxed));
}

// After take_activity, PyTorch's operator gate tells the activity again whenever the launches
// go unseen (a profiler holds CUPTI: gate.md), so the word may move behind the launches' back.
// What it holds is adopted, from the gate's thread while its callbacks are on: a rise it did
// not make drops once the process has been idle for the grace time from `now`, and a drop lets
// the next launch raise the word again. A no-op where activity was not taken.
template <class G>
void follow_activity_word(G& g, const uint8_t* ctl, int64_t now) {
  if (!g.activity_taken.load(std::memory_order_relaxed)) {
    return;
  }
  const uint32_t word = load32(ctl, kOffAutoActive) != 0 ? 1 : 0;
  if (g.active.load() != word) {
    if (word != 0) {
      g.last_launch_ns.store(now, std::memory_order_relaxed);
    }
    g.active.store(word);
  }
}

// PyTorch's operator gate stopped publishing auto_active; from now the launches publish it.
// The word as that gate left it is adopted (follow_activity_word), so that a rise it published
// drops here once the process launched nothing for the grace time. False where no block or no
// activity is had.
template <class G>
bool take_activity(G& g) {
  uint8_t* ctl = g.ctl.load(std::memory_order_acquire);
  if (ctl == nullptr || !g.cfg.auto_activity) {
    return false;
  }
  g.activity_taken.store(true);
  follow_activity_word(g, ctl, now_ns());
  return true;
}

// Spins briefly, then sleeps on the gate word (the daemon wakes its futex when it opens the
// gate) until `must_wait(word, watch list)` says the launch may go; watched words are polled.
template <class G, class MustWait>
void wait_open(G& g, uint8_t* ctl, MustWait&& must_wait) {
  NoGil nogil;
  auto* word = reinterpret_cast<uint32_t*>(ctl + kOffGateClosed);
  const int64_t start = now_ns();
  add64(ctl, kOffDriverWaits, 1);
  for (int spins = 0;;) {
    const uint32_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    const WatchList* list = g.watch.load(std::memory_order_acquire);
    if (!must_wait(seen, list)) {
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

// One launch, before it is queued: counted, held while `must_wait` says so, and, for a task
// whose launches tell its activity (launches_tell_activity), raising auto_active and ringing
// the daemon at the first launch after a quiet time.
template <class G, class MustWait>
void hold_launch(G& g, uint8_t* ctl, MustWait&& must_wait) {
  add64(ctl, kOffDriverLaunches, 1);
  const uint32_t word = load32(ctl, kOffGateClosed);
  if (word != 0 || g.watch.load(std::memory_order_relaxed) != nullptr) {
    if (must_wait(word, g.watch.load(std::memory_order_acquire))) {
      wait_open(g, ctl, must_wait);
    }
  }
  if (launches_tell_activity(g)) {
    g.last_launch_ns.store(now_ns(), std::memory_order_relaxed);
    if (g.active.exchange(1) == 0) {
      set_activity_word(ctl, kOffAutoActive, 1);
      ring_doorbell(g.doorbell);
    }
  }
}

// What came of handing a gate the client's control block.
enum class Adopted {
  kRefused,  // a bad memfd, or the gate already holds another block
  kAgain,    // the block it holds already (a second framework's client in the process)
  kMapped,   // mapped now and published to the gate's launches
};

// Maps the client's control block (memfd) for gate `g`, never to unmap it: a launch at exit,
// after the interpreter let go of its own mapping, still finds it. `configure` sets the gate's
// own settings, before the block is published to its launches.
template <class G, class Configure>
Adopted adopt_block(G& g, int memfd, int doorbell, int bound, int auto_activity, int torch_gate,
                    double idle_grace_ms, Configure&& configure) {
  struct stat st {};
  if (fstat(memfd, &st) != 0 || st.st_size < static_cast<off_t>(kSize)) {
    return Adopted::kRefused;
  }
  if (g.ctl.load() != nullptr && g.adopted.load() && g.adopted_inode == st.st_ino) {
    g.cfg.torch_gate = g.cfg.torch_gate || torch_gate != 0;  // PyTorch came after CuPy
    return Adopted::kAgain;
  }
  if (g.ctl.load() != nullptr) {
    return Adopted::kRefused;
  }
  void* mapped = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (mapped == MAP_FAILED) {
    return Adopted::kRefused;
  }
  g.cfg.bound = bound != 0;
  g.cfg.auto_activity = auto_activity != 0;
  g.cfg.torch_gate = torch_gate != 0;
  g.cfg.idle_grace_ms = idle_grace_ms;
  configure();
  g.doorbell = dup(doorbell);
  g.adopted_inode = st.st_ino;
  g.adopted.store(true);
  g.ctl.store(static_cast<uint8_t*>(mapped), std::memory_order_release);
  return Adopted::kMapped;
}

// Publishes the watched tasks' control blocks (read-only mappings the client keeps) and the
// version of the daemon's list. A list is never freed: a launch may be reading it.
template <class G>
void publish_watch(G& g, const uintptr_t* blocks, size_t n, uint32_t version) {
  auto* list = new WatchList();
  list->n = n < kMaxWatched ? n : kMaxWatched;
  for (size_t i = 0; i < list->n; ++i) {
    list->blocks[i] = reinterpret_cast<const uint8_t*>(blocks[i]);
  }
  list->version = n <= kMaxWatched ? version : 0;
  g.watch.store(n == 0 ? nullptr : list, std::memory_order_release);
}

// The version of the watch list the gate holds now (0: none, or incomplete).
template <class G>
uint32_t watch_version(const G& g) {
  const WatchList* list = g.watch.load(std::memory_order_acquire);
  return list == nullptr ? 0 : list->version;
}

}  // namespace gpreempt_words
