// What every file of the PyTorch operator gate (operator_gate.h) needs before its state: the
// control block's words (their layout in control_layout.h, read with plain atomic loads and
// stores on the shared mapping), clocks and waits on a word, the GIL released for a blocking
// wait, and the optional features of c10's generic device interface.
#pragma once

#include <Python.h>

#include <ATen/record_function.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "control_layout.h"
#include "gate_words.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GATE_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define GATE_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define GATE_CPU_RELAX() \
  do {                   \
  } while (0)
#endif

namespace gpreempt_gate {

// The control block's offsets and words: the one layout of gpreempt/control.py.
using namespace gpreempt_layout;

// The control blocks of the tasks that outrank this one, mapped read-only (set by the session
// from the daemon's watch list), the word access and the watch rule: shared with the other
// native gates (gate_words.h).
using gpreempt_words::closed_while_watched;
using gpreempt_words::kMaxWatched;
using gpreempt_words::load32;
using gpreempt_words::set_activity_word;
using gpreempt_words::store32;
using gpreempt_words::watched_active;
using gpreempt_words::WatchList;

enum Mode : int { kAdaptive = 0, kTight = 1, kOpen = 2 };

// Feature detection: newer PyTorch versions add these to the generic device interface.
template <class T, class = void>
struct HasIsStreamCapturing : std::false_type {};
template <class T>
struct HasIsStreamCapturing<T,
                            std::void_t<decltype(std::declval<const T&>().isStreamCapturing(
                                std::declval<const c10::Stream&>()))>> : std::true_type {};

template <class T, class = void>
struct HasElapsedTime : std::false_type {};
template <class T>
struct HasElapsedTime<T, std::void_t<decltype(std::declval<const T&>().elapsedTime(
                             std::declval<void*>(), std::declval<void*>(),
                             std::declval<c10::DeviceIndex>()))>> : std::true_type {};

template <class T>
bool stream_capturing(const T* impl, const c10::Stream& stream) {
  if constexpr (HasIsStreamCapturing<T>::value) {
    return impl->isStreamCapturing(stream);
  } else {
    return false;  // the Python side counts captures begun through torch.cuda.CUDAGraph
  }
}

template <class T>
double elapsed_ms(const T* impl, void* first, void* second, c10::DeviceIndex device) {
  if constexpr (HasElapsedTime<T>::value) {
    return impl->elapsedTime(first, second, device);
  } else {
    return -1.0;
  }
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void sleep_ns(int64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  nanosleep(&ts, nullptr);
}

// Sleeps up to `ns` while the word still holds `seen`. The daemon wakes the word's waiters
// (FUTEX_WAKE) right after it opens a gate, so a waiting task resumes at once rather than at
// its next poll; words nobody wakes (the in-process scheduler's) are simply polled.
inline void wait_word(const uint32_t* word, uint32_t seen, int64_t ns) {
#if defined(__linux__) && defined(SYS_futex)
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, nullptr, 0);  // EAGAIN, EINTR: look again
#else
  (void)word;
  (void)seen;
  sleep_ns(ns);
#endif
}

// Releases the GIL for a blocking wait if this thread holds it, and takes it back at the end of
// the scope. Most operators called from Python already run without the GIL; a few do not, and
// blocking them with the GIL held would stop every other Python thread of the process,
// including one that might be about to open the gate.
class MaybeNoGil {
 public:
  MaybeNoGil() = default;
  MaybeNoGil(const MaybeNoGil&) = delete;
  MaybeNoGil& operator=(const MaybeNoGil&) = delete;
  void release() {
    if (state_ == nullptr && Py_IsInitialized() && PyGILState_Check()) {
      state_ = PyEval_SaveThread();
    }
  }
  ~MaybeNoGil() {
    if (state_ != nullptr) {
      PyEval_RestoreThread(state_);
    }
  }

 private:
  PyThreadState* state_ = nullptr;
};

// Takes `mu` at once where it is free, else lets the GIL go (through `nogil`, declared before
// the lock so that the lock is let go first) and waits for it. A thread holding mu may wait on
// the GPU for work held at a barrier that only a Python thread can free (the client's stranded
// watch, once the daemon is gone), so no thread may wait for mu while it holds the GIL.
inline std::unique_lock<std::mutex> lock_without_gil(std::mutex& mu, MaybeNoGil& nogil) {
  std::unique_lock<std::mutex> lock(mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    nogil.release();
    lock.lock();
  }
  return lock;
}

// --- control block access: plain atomic loads and stores on the shared mapping -------------
inline void store64(uint8_t* base, size_t off, uint64_t v) {
  __atomic_store_n(reinterpret_cast<uint64_t*>(base + off), v, __ATOMIC_RELAXED);
}

}  // namespace gpreempt_gate
