// The rule of the check that stream barriers hold (driver_verify.cpp), without CUDA: what a
// barrier's last wait reads, its word read at one moment, and when two reads prove that the GPU
// passed a wait whose word never dropped. A test on the CPU runs it on control-block words
// written as the clients write them (tests/test_barrier_check.py).
//
// A read taken while the GPU cannot have reached the barrier yet, and a read taken after the
// event behind it completed, bracket the moment the GPU passed it. Every rise of a watched
// task's `requests` or `auto_active` bumps its block's activity epoch first (gate_words.h), so a
// word read raised at both with one epoch stayed raised in between: had it dropped, its next
// rise would have changed the epoch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gate_words.h"

namespace gpreempt_driver {

using gpreempt_words::kMaxWatched;
using gpreempt_words::WatchList;

// Which of a watched block's activity words a wait reads.
enum class Words : uint8_t {
  kRequests,  // requests alone (the task marks its requests: auto_active is not read)
  kActive,    // auto_active alone (where the pair cannot be read in one wait)
  kPair,      // requests and auto_active, adjacent, in one 64-bit wait: both must be 0
};

// A barrier's last wait's word, read at one moment: raised or not, and the activity epoch.
struct WordLook {
  bool valid = false;
  bool raised = false;
  uint32_t epoch = 0;
};

// The last wait of a mark's barrier: the GPU passes the barrier when it passes that wait. Null
// list: no barrier.
struct BarrierNote {
  const WatchList* list = nullptr;  // the watch list the barrier waited on
  uint8_t block = 0;                // the block of its last wait, in that list
  Words words = Words::kRequests;   // what that wait read
  // that word, read at the last moment the GPU was known not to have reached the barrier: just
  // before it was put, then at each look that found the event before it pending
  WordLook unpassed;
};

// The watched words at one moment: bit i of `requests` / `active`: block i's word raised.
struct WatchSample {
  const WatchList* list = nullptr;
  uint32_t requests = 0;
  uint32_t active = 0;
  uint32_t epochs[kMaxWatched] = {};
};

// The watched words of `list` now (any thread).
inline WatchSample sample_words(const WatchList* list) {
  using namespace gpreempt_words;
  WatchSample s;
  s.list = list;
  for (size_t i = 0; list != nullptr && i < list->n; ++i) {
    const uint8_t* b = list->blocks[i];
    // the words before the epoch: a rise seen here comes with its bump (gate_words.h)
    const auto* words = reinterpret_cast<const uint32_t*>(b);
    if (__atomic_load_n(words + kOffRequests / 4, __ATOMIC_ACQUIRE) != 0) {
      s.requests |= 1u << i;
    }
    if (__atomic_load_n(words + kOffAutoActive / 4, __ATOMIC_ACQUIRE) != 0) {
      s.active |= 1u << i;
    }
    s.epochs[i] = load32(b, kOffActivityEpoch);
  }
  return s;
}

// The word of `note`'s last wait in `s`; not valid where `s` is of another watch list.
inline WordLook look_of(const BarrierNote& note, const WatchSample& s) {
  WordLook look;
  if (note.list == nullptr || s.list != note.list) {
    return look;
  }
  const uint32_t raised = note.words == Words::kRequests ? s.requests
                          : note.words == Words::kActive ? s.active
                                                         : s.requests | s.active;
  look.valid = true;
  look.raised = (raised & (1u << note.block)) != 0;
  look.epoch = s.epochs[note.block];
  return look;
}

// Whether the GPU passed `note`'s barrier while its last wait's word stayed raised: read raised
// before the GPU reached it (`note.unpassed`) and, with the same epoch, in `after`, read once
// the event behind it had completed.
inline bool passed_while_raised(const BarrierNote& note, const WatchSample& after) {
  const WordLook later = look_of(note, after);
  return note.unpassed.valid && note.unpassed.raised && later.valid && later.raised &&
         later.epoch == note.unpassed.epoch;
}

// Whether the check can tell anything of `note`'s barrier: its word was read raised before the
// GPU reached it, and `after` reads the same watch list. Each such barrier, leaked or not, is
// counted in barriers_checked: how many of the gate's barriers were dated while they held.
inline bool dated(const BarrierNote& note, const WatchSample& after) {
  return note.unpassed.valid && note.unpassed.raised && look_of(note, after).valid;
}

// A hold's rise, at the gate thread's looks: the first look that finds a watched task active or
// the gate closed outright (its word odd; an even word, closed while watched, holds only while
// a watched task is active) after one that found neither. At that look the thread puts one
// more barrier behind each stream's queued work, its word read raised as it is put: the GPU
// may have reached the stream's last barrier before any look read that word raised, and a
// program whose CPU keeps pace then stands on it, launching nothing, so the hold would go
// undated (rise_barriers).
class HoldRise {
 public:
  bool rose(uint32_t gate_word, const WatchList* w) {
    const bool held = gpreempt_words::watched_active(w) || (gate_word & 1u) != 0;
    const bool rise = held && !held_;
    held_ = held;
    return rise;
  }

 private:
  bool held_ = false;
};

}  // namespace gpreempt_driver
