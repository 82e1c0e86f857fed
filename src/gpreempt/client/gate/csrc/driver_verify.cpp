// Whether the stream barriers hold: found on the GPU, not assumed.
//
// A barrier is a row of waits on host words (this gate's word, then each watched task's
// requests and, unless it marks requests, auto_active: both in one 64-bit wait, which passes
// once both are 0); the event recorded right behind it
// completes when the GPU has passed its last wait. The gate's thread looks every quarter
// millisecond, while awake, at which marks completed since its last look, and at the watched
// words. A word that read raised at two looks with the same activity epoch (bumped by every
// rise, gate_words.h) stayed raised in between: a mark that completed between the look before
// the first of them and the second, behind a barrier whose last wait is on that word, passed
// a wait whose word never dropped. That is a leak: it is counted in the control block's
// barrier_leaks, and the daemon then no longer trusts the gate (backstop_plan.py).
//
// The looks order matters: the marks are queried before the words are read, so the words'
// looks enclose the moments the GPU could have passed. A word dropping and rising again
// between two looks (a server between two requests) changes the epoch: its barrier may pass
// then, and is not counted.
#include <algorithm>
#include <utility>
#include <vector>

#include "driver_gate.h"

namespace gpreempt_driver {

namespace {

// The watched words at one look.
struct WatchSample {
  const WatchList* list = nullptr;
  uint32_t requests = 0;  // bit i: block i's requests raised
  uint32_t active = 0;    // bit i: its auto_active raised
  uint32_t epochs[kMaxWatched] = {};
};

WatchSample sample(const WatchList* list) {
  WatchSample s;
  s.list = list;
  for (size_t i = 0; i < list->n; ++i) {
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

// Whether the word of `note`'s last wait read raised, with one epoch, at every look of `looks`.
bool stayed_raised(const BarrierNote& note, const WatchSample* const* looks, size_t n) {
  if (note.list == nullptr) {
    return false;
  }
  const uint32_t bit = 1u << note.block;
  for (size_t j = 0; j < n; ++j) {
    const WatchSample& s = *looks[j];
    const uint32_t raised = note.words == Words::kRequests ? s.requests
                            : note.words == Words::kActive ? s.active
                                                           : s.requests | s.active;
    if (s.list != note.list || s.epochs[note.block] != looks[0]->epochs[note.block] ||
        (raised & bit) == 0) {
      return false;
    }
  }
  return true;
}

// The gate's thread alone calls verify_barriers: the two looks before this one, the count of
// looks, and the first look of the present row of looks taken while the check was on.
WatchSample before_last, last;
uint64_t look = 0;
uint64_t row_start = 0;
bool in_row = false;

}  // namespace

void verify_barriers(Gate& g, bool on) {
  uint8_t* ctl = g.ctl.load(std::memory_order_acquire);
  const WatchList* list = g.watch.load(std::memory_order_acquire);
  if (!on || ctl == nullptr || list == nullptr || list->n == 0 || !barriers_hold(g, ctl)) {
    in_row = false;  // the next look starts a new row
    return;
  }
  ++look;
  if (!in_row) {
    in_row = true;
    row_start = look;
  }
  const Guard guard;
  std::lock_guard<std::mutex> lock(g.mu);
  // the marks first: which completed since the last look (their barriers passed meanwhile)
  bool leaked = false;
  static std::vector<std::pair<StreamState*, uint64_t>> passed;  // (stream, first pending mark)
  passed.clear();
  for (auto& [stream, st] : g.streams) {
    const CurrentContext current(st.context);
    uint64_t pending = st.next_seq;
    for (const Mark& m : st.marks) {
      if (cu()->cuEventQuery(m.event) != CUDA_SUCCESS) {  // an error proves nothing: pending
        pending = m.seq;
        break;
      }
    }
    passed.emplace_back(&st, pending);
  }
  // then the words: with the two looks before, they enclose every moment a mark passed
  const WatchSample now = sample(list);
  const WatchSample* looks[] = {&before_last, &last, &now};
  for (auto [st, pending] : passed) {
    if (look >= row_start + 2 && st->verified_round == look - 1) {
      const uint64_t oldest_note = st->next_seq > kNotes ? st->next_seq - kNotes : 0;
      for (uint64_t seq = std::max(st->verified_from, oldest_note); seq < pending; ++seq) {
        leaked = leaked || stayed_raised(st->notes[seq % kNotes], looks, 3);
      }
    }
    st->verified_from = pending;
    st->verified_round = look;
  }
  before_last = last;
  last = now;
  if (leaked) {
    __atomic_fetch_add(reinterpret_cast<uint32_t*>(ctl + kOffBarrierLeaks), 1u,
                       __ATOMIC_RELAXED);
    ring(g);
  }
}

}  // namespace gpreempt_driver
