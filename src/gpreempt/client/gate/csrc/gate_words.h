// What the native launch gates share about the control block's words (control_layout.h): reading
// and writing them, the watched tasks' activity, the doorbell, and letting Python threads run
// while a launch waits. Header-only: the CUDA driver-level gate (driver_gate.h) and the HIP
// launch gate (rocm/rocm_gate.h) are separate libraries.
#pragma once

#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

#include "control_layout.h"

namespace gpreempt_words {

using namespace gpreempt_layout;

inline uint32_t load32(const uint8_t* base, size_t off) {
  return __atomic_load_n(reinterpret_cast<const uint32_t*>(base + off), __ATOMIC_RELAXED);
}
inline void store32(uint8_t* base, size_t off, uint32_t v) {
  __atomic_store_n(reinterpret_cast<uint32_t*>(base + off), v, __ATOMIC_RELAXED);
}
inline void add64(uint8_t* base, size_t off, uint64_t v) {
  __atomic_fetch_add(reinterpret_cast<uint64_t*>(base + off), v, __ATOMIC_RELAXED);
}

// Writes `v` to a word of the activity pair (requests, auto_active). A rise from 0 bumps the
// activity epoch first, so that a gate that read the word raised at two moments with one
// epoch knows it stayed raised in between (driver_verify.cpp).
inline void set_activity_word(uint8_t* base, size_t off, uint32_t v) {
  if (v != 0 && load32(base, off) == 0) {
    __atomic_fetch_add(reinterpret_cast<uint32_t*>(base + kOffActivityEpoch), 1u,
                       __ATOMIC_RELAXED);
  }
  __atomic_store_n(reinterpret_cast<uint32_t*>(base + off), v, __ATOMIC_RELEASE);
}

inline int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// Tells the daemon the activity words changed.
inline void ring_doorbell(int doorbell) {
  if (doorbell < 0) {
    return;
  }
  uint64_t one = 1;
  ssize_t ignored = write(doorbell, &one, sizeof(one));  // EAGAIN: it rings already
  (void)ignored;
}

// The control blocks of the tasks that outrank this one, mapped read-only, and the daemon's
// version of that list. A list is never changed once published.
constexpr size_t kMaxWatched = 8;
struct WatchList {
  size_t n = 0;
  const uint8_t* blocks[kMaxWatched] = {};
  uint32_t version = 0;  // 0 = incomplete: never matches a closed-while-watched word
};

// Whether a watched task wants the GPU (gpreempt.control.wants_gpu).
inline bool watched_active(const WatchList* w) {
  for (size_t i = 0; w != nullptr && i < w->n; ++i) {
    const uint8_t* b = w->blocks[i];
    if (load32(b, kOffRequests) != 0 ||
        (load32(b, kOffAutoActive) != 0 && load32(b, kOffHinted) == 0)) {
      return true;
    }
  }
  return false;
}

// Whether the daemon closed the gate only while the tasks of the gate's watch list are active
// (gpreempt.control.released_by_watch).
inline bool closed_while_watched(uint32_t word, const WatchList* w) {
  return word != 0 && (word & 1u) == 0 && w != nullptr && w->version != 0 &&
         word / 2 == w->version;
}

// Lets other Python threads run while this one waits (the client's own threads among them).
class NoGil {
 public:
  NoGil() {
    using Check = int (*)();
    using Save = void* (*)();
    static const auto initialized =
        reinterpret_cast<Check>(dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
    static const auto held = reinterpret_cast<Check>(dlsym(RTLD_DEFAULT, "PyGILState_Check"));
    static const auto save = reinterpret_cast<Save>(dlsym(RTLD_DEFAULT, "PyEval_SaveThread"));
    if (initialized != nullptr && held != nullptr && save != nullptr && initialized() != 0 &&
        held() != 0) {
      state_ = save();
    }
  }
  ~NoGil() {
    using Restore = void (*)(void*);
    static const auto restore =
        reinterpret_cast<Restore>(dlsym(RTLD_DEFAULT, "PyEval_RestoreThread"));
    if (state_ != nullptr && restore != nullptr) {
      restore(state_);
    }
  }
  NoGil(const NoGil&) = delete;
  NoGil& operator=(const NoGil&) = delete;

 private:
  void* state_ = nullptr;
};

}  // namespace gpreempt_words
