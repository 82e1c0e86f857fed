// A process's open request scopes (gpreempt.request()), counted in native code so that a request
// costs its thread no wake-up and no interpreter lock (gpreempt/client/native_scopes.py).
//
// The `requests` word of the control block is raised when the first scope opens and dropped a
// linger after the last one closes (gpreempt/client/linger.py says why). The drop comes from a
// helper thread that never takes the interpreter lock. Waking a sleeping thread costs the waker
// a system call, which a server would pay at the end of every request; a helper that polls all
// through a request takes the request's core from it every poll. So the helper sleeps through
// most of a request and polls every `tick` (at most the linger) from shortly before the shortest
// of the last requests would have ended: a closing scope then only writes the deadline, which
// the helper sees in time and waits for itself. A request that ends before the helper polls
// wakes it. Between requests it polls every kSlowTickNs for kSlowForNs, which lets it see a
// request open without being woken.
//
// The first request of a busy period raises the word, which every watching gate and stream
// barrier reads at once, and rings the daemon's doorbell, which costs the request a system call
// and a wake-up. While the daemon says that every task this one outranks holds itself on the
// word (the block's `quiet`), and the helper polls, the request leaves the ring to the helper's
// next poll: the daemon hears of it at most kSlowTickNs later, and nobody waits for the daemon.
//
// Plain C ABI, called through ctypes with the interpreter lock held (the calls are short and
// then serialised with the caller's other threads). Plain C++ and libc: no CUDA, no Python.
#include <sys/prctl.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <new>
#include <thread>

#include "gate_words.h"

namespace {

using gpreempt_words::load32;
using gpreempt_words::now_ns;
using gpreempt_words::ring_doorbell;
using gpreempt_words::set_activity_word;
using gpreempt_words::store32;
using namespace gpreempt_layout;

constexpr int64_t kMinTickNs = 20000;          // the fastest poll near a request's end
constexpr int64_t kMaxTickNs = 250000;         // the slowest (a linger longer than this)
constexpr int64_t kSlowTickNs = 250000;        // between requests
constexpr int64_t kSlowForNs = 2000000000;     // ... for this long after the last one
constexpr int64_t kNever = INT64_MAX;          // an untimed wait
constexpr unsigned long kTimerSlackNs = 1000;  // timed waits end within 1 us of their time
constexpr int kLengths = 8;                    // request lengths the prediction looks back on

struct Scopes {
  uint8_t* block;
  int doorbell;
  int64_t linger_ns;
  int64_t tick_ns;

  std::mutex mu;
  std::condition_variable cv;
  uint32_t open = 0;         // scopes open now
  int64_t open_since = 0;    // when the count last rose from 0
  int64_t deadline = 0;      // when the word drops (0: nothing lingers)
  int64_t wake_at = kNever;  // when the helper's wait ends by itself
  bool ring = false;         // the helper rings the doorbell when it next wakes (a quiet raise)
  int64_t last_busy = 0;     // when a request was last open or lingering
  int64_t lengths[kLengths] = {};  // the last requests' lengths (0: none yet)
  int next_length = 0;
  uint64_t releases = 0;  // drops after a linger
  uint64_t bridged = 0;   // requests that opened while the word still lingered
  uint64_t wakes = 0;     // times a closing scope had to wake the helper
  uint64_t deferred = 0;  // raises whose ring the helper did
  bool helper_runs = false;  // started by the first scope (none without a linger)
};

std::chrono::steady_clock::time_point at(int64_t ns) {
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns));
}

// From when the helper polls while a request is open: early enough to see the request end in
// time for its deadline, late enough to leave the request's thread alone while it runs.
int64_t poll_from(const Scopes* s) {
  int64_t shortest = kNever;
  for (int64_t length : s->lengths) {
    shortest = length > 0 && length < shortest ? length : shortest;
  }
  return shortest == kNever ? s->open_since : s->open_since + shortest - 2 * s->tick_ns;
}

void run(Scopes* s);

// Starts the helper for the first scope, so that a process that never opens one (a trainer)
// has no thread for it. Called with the mutex held.
void start_helper(Scopes* s) {
  if (s->helper_runs || s->linger_ns == 0) {
    return;
  }
  try {
    std::thread(run, s).detach();
    s->helper_runs = true;
    s->last_busy = now_ns();
  } catch (...) {  // no exception may cross into the caller (ctypes)
    s->linger_ns = 0;  // nobody could drop the word later: it drops when the last scope ends
  }
}

void run(Scopes* s) {
  prctl(PR_SET_TIMERSLACK, kTimerSlackNs, 0, 0, 0);
  std::unique_lock<std::mutex> lock(s->mu);
  for (;;) {
    const int64_t now = now_ns();
    if (s->ring) {
      s->ring = false;
      lock.unlock();
      ring_doorbell(s->doorbell);
      lock.lock();
      continue;
    }
    if (s->deadline != 0 && now >= s->deadline) {  // (a deadline stands only with none open)
      set_activity_word(s->block, kOffRequests, 0);
      s->deadline = 0;
      ++s->releases;
      lock.unlock();  // a scope opening meanwhile raises the word again, and rings after this
      ring_doorbell(s->doorbell);
      lock.lock();
      continue;
    }
    int64_t until = kNever;
    if (s->deadline != 0) {
      until = s->deadline;
    } else if (s->open != 0) {
      const int64_t from = poll_from(s);
      until = from > now ? from : now + s->tick_ns;
    } else if (now - s->last_busy < kSlowForNs) {
      until = now + kSlowTickNs;  // it sees a request open within this, without being woken
    }
    if (s->deadline != 0 || s->open != 0) {
      s->last_busy = now;
    }
    s->wake_at = until;
    if (until == kNever) {
      s->cv.wait(lock);
    } else {
      s->cv.wait_until(lock, at(until));
    }
    s->wake_at = 0;  // awake: it looks at everything before it waits again
  }
}

}  // namespace

extern "C" {

// A counter of scopes for the control block mapped at `block` (kept mapped for the process's
// life), its doorbell, and a linger of `linger_s` seconds (0: the word drops when the last scope
// closes). Never freed: the helper thread, started by the first scope, lives as long as the
// process. Null where it cannot be made (no memory); a helper thread that cannot start leaves it
// without a linger.
__attribute__((visibility("default"))) void* gpreempt_scopes_open(uintptr_t block, int doorbell,
                                                                  double linger_s) {
  auto* s = new (std::nothrow) Scopes();
  if (s == nullptr) {
    return nullptr;
  }
  s->block = reinterpret_cast<uint8_t*>(block);
  s->doorbell = doorbell;
  s->linger_ns = static_cast<int64_t>(linger_s * 1e9);
  s->tick_ns = s->linger_ns < kMinTickNs   ? kMinTickNs
               : s->linger_ns > kMaxTickNs ? kMaxTickNs
                                           : s->linger_ns;
  return s;
}

// A scope opens. `hint`: from now on the process's requests alone say when it is active
// (gpreempt.control_block.ControlBlock.set_requests). Returns 1 if it raised the word (neither
// another open scope nor a lingering one held it raised).
__attribute__((visibility("default"))) int gpreempt_scopes_enter(void* handle, int hint) {
  auto* s = static_cast<Scopes*>(handle);
  bool raised = false;
  bool quiet = false;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    start_helper(s);
    if (++s->open == 1) {
      s->open_since = now_ns();
      if (s->deadline != 0) {
        s->deadline = 0;
        ++s->bridged;
      } else {
        raised = true;
      }
    }
    const bool new_hint = hint != 0 && load32(s->block, kOffHinted) == 0;
    if (!raised && !new_hint) {
      return 0;
    }
    if (hint != 0) {
      store32(s->block, kOffHinted, 1);
    }
    set_activity_word(s->block, kOffRequests, 1);
    // a raise finds the helper polling between requests (it rings within kSlowTickNs) or
    // awake (it looks before it waits again); one asleep would need waking
    quiet = raised && !new_hint && s->helper_runs && s->wake_at != kNever &&
            __atomic_load_n(reinterpret_cast<const uint32_t*>(s->block + kOffQuiet),
                            __ATOMIC_ACQUIRE) != 0;
    if (quiet) {
      s->ring = true;
      ++s->deferred;
    }
  }
  if (!quiet) {
    ring_doorbell(s->doorbell);
  }
  return raised ? 1 : 0;
}

// A scope closes: the last one sets the deadline of the drop (or drops at once without a
// linger), and wakes the helper only if its wait would end after that deadline.
__attribute__((visibility("default"))) void gpreempt_scopes_exit(void* handle) {
  auto* s = static_cast<Scopes*>(handle);
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->open == 0 || --s->open != 0) {
      return;
    }
    const int64_t now = now_ns();
    s->lengths[s->next_length] = now - s->open_since;
    s->next_length = (s->next_length + 1) % kLengths;
    if (s->linger_ns == 0) {
      set_activity_word(s->block, kOffRequests, 0);
    } else {
      s->deadline = now + s->linger_ns;
      wake = s->wake_at > s->deadline;  // 0 (awake) never: it looks before it waits again
      s->wakes += wake ? 1 : 0;
    }
  }
  if (s->linger_ns == 0) {
    ring_doorbell(s->doorbell);
    return;
  }
  if (wake) {
    s->cv.notify_one();
  }
}

// 0: drops after a linger, 1: requests bridged by one, 2: wake-ups of the helper, 3: raises
// whose ring the helper did, else: scopes open.
__attribute__((visibility("default"))) uint64_t gpreempt_scopes_stat(void* handle, int which) {
  auto* s = static_cast<Scopes*>(handle);
  std::lock_guard<std::mutex> lock(s->mu);
  switch (which) {
    case 0:
      return s->releases;
    case 1:
      return s->bridged;
    case 2:
      return s->wakes;
    case 3:
      return s->deferred;
    default:
      return s->open;
  }
}

}  // extern "C"
