// Whether the stream barriers hold: found on the GPU, not assumed.
//
// A barrier is a row of waits on host words (this gate's word, then each watched task's
// requests and, unless it marks requests, auto_active: both in one 64-bit wait, which passes
// once both are 0). An event before it (its mark's timed `before`, else the previous mark's
// event, behind the previous barrier) completes when the GPU has run the work before it, and
// only then does the GPU read the words (benchmarks/driver_gate/wait_order.py); the mark's event
// behind it completes once the GPU has passed its last wait. The oldest mark left on a stream
// has no event before it (the previous mark retired): its word is not read again, and a barrier
// that let work through there is found at the next one, one spacing of GPU time later.
//
// The last wait's word is read just before the barrier is put, then at each look that finds the
// event before it pending (the word read first, the event queried after); and once more at the
// look that finds its mark complete (the mark queried first, the word read after). Where the
// first and the last read find the word raised with one epoch, the GPU passed a wait whose word
// never dropped (barrier_check.h). Each barrier whose word was read raised before the GPU
// reached it is counted in the control block's barriers_checked, leaked or not: the barriers
// the check could date. One that passed while its word stayed raised is a leak: it is counted
// in the control block's barrier_leaks, and the daemon then no longer trusts the gate
// (backstop_plan.py). The gate's thread looks every quarter millisecond while awake.
//
// The barriers the gate's thread puts while its callbacks are off (asleep or paced) are
// numbered and noted with the others. They are checked once the gate wakes, which it does
// within a tick of a watched task's rise: their marks then join the stream's (end_asleep_marks),
// and the first look reads the word raised for each the GPU has not reached yet. The GPU may
// have reached a stream's last barrier before that look (a program whose CPU keeps pace has
// about one in flight, then waits for it, launching nothing): at a hold's rise the thread puts
// one more behind each stream's queued work (rise_barriers), read raised as it is put, so the
// hold of a stream with work queued is dated once it ends.
//
// A mark still pending does not date the pass: the GPU may run other contexts for a time slice
// between passing a barrier and completing the event behind it, and a word raised meanwhile
// was down when the GPU read it.
#include <algorithm>
#include <utility>
#include <vector>

#include "driver_gate.h"

namespace gpreempt_driver {

namespace {

// The event before a mark's barrier, if one is left: `previous` is the mark put before it on
// its stream (null for the oldest).
CUevent event_before(const Mark& m, const Mark* previous) {
  return m.before != nullptr ? m.before : previous != nullptr ? previous->event : nullptr;
}

}  // namespace

void verify_barriers(Gate& g, bool on) {
  uint8_t* ctl = g.ctl.load(std::memory_order_acquire);
  const WatchList* list = g.watch.load(std::memory_order_acquire);
  if (!on || ctl == nullptr || list == nullptr || list->n == 0 || !barriers_hold(g, ctl)) {
    return;
  }
  const Guard guard;
  std::lock_guard<std::mutex> lock(g.mu);
  const RelaxedCapture relaxed(capture_possible(g));
  // the marks first: which completed since the last look (their barriers passed before now)
  static std::vector<std::pair<StreamState*, uint64_t>> passed;  // (stream, first pending mark)
  passed.clear();
  for (auto& [key, st] : g.streams) {
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
  // then the words
  const WatchSample now = sample_words(list);
  bool leaked = false;
  uint32_t checked = 0;
  for (auto [st, pending] : passed) {
    const uint64_t oldest_note = st->next_seq > kNotes ? st->next_seq - kNotes : 0;
    for (uint64_t seq = std::max(st->verified_from, oldest_note); seq < pending; ++seq) {
      const BarrierNote& note = st->notes[seq % kNotes];
      checked += dated(note, now) ? 1 : 0;
      leaked = leaked || passed_while_raised(note, now);
    }
    st->verified_from = std::max(st->verified_from, pending);
  }
  // last, the barriers the GPU has not reached yet: from the first whose event before it is
  // pending (queried after the words were read), every later one on its stream
  for (auto [st, pending] : passed) {
    const CurrentContext current(st->context);
    bool reached = true;
    const Mark* previous = nullptr;
    for (const Mark& m : st->marks) {
      const Mark* prior = std::exchange(previous, &m);
      if (m.seq < pending || st->next_seq - m.seq > kNotes) {
        continue;
      }
      if (reached) {
        const CUevent e = event_before(m, prior);
        reached = e == nullptr || cu()->cuEventQuery(e) != CUDA_ERROR_NOT_READY;
      }
      if (!reached) {
        BarrierNote& note = st->notes[m.seq % kNotes];
        const WordLook look = look_of(note, now);
        if (look.valid) {
          note.unpassed = look;
        }
      }
    }
  }
  if (checked != 0) {
    __atomic_fetch_add(reinterpret_cast<uint32_t*>(ctl + kOffBarriersChecked), checked,
                       __ATOMIC_RELAXED);
  }
  if (leaked) {
    __atomic_fetch_add(reinterpret_cast<uint32_t*>(ctl + kOffBarrierLeaks), 1u,
                       __ATOMIC_RELAXED);
    ring(g);
  }
}

}  // namespace gpreempt_driver
