// The driver-level gate's marks on each stream: a stream barrier where one holds, an event
// behind it that tells when the GPU got there, the GPU time per launch learned from those events
// (it spaces the barriers), and the bound on the work in flight.
#include <algorithm>
#include <array>

#include "driver_gate.h"

namespace gpreempt_driver {

bool capturing(CUstream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return cu()->cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS ||
         status != CU_STREAM_CAPTURE_STATUS_NONE;
}

CUevent take_event(Gate& g, CUcontext ctx, bool timed) {
  std::deque<CUevent>& spare = (timed ? g.spare_events : g.spare_plain)[ctx];
  if (!spare.empty()) {
    CUevent e = spare.back();
    spare.pop_back();
    return e;
  }
  CUevent e = nullptr;
  return cu()->cuEventCreate(&e, timed ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING) ==
                 CUDA_SUCCESS
             ? e
             : nullptr;
}

void give_event(Gate& g, CUcontext ctx, CUevent e, bool timed) {
  if (e != nullptr) {
    (timed ? g.spare_events : g.spare_plain)[ctx].push_back(e);
  }
}

void give_mark(Gate& g, CUcontext ctx, const Mark& m) {
  give_event(g, ctx, m.event, m.timed);
  give_event(g, ctx, m.before, true);
}

namespace {

// The device address of a control block word; its page is registered once and stays so.
CUdeviceptr device_word(Gate& g, const uint8_t* word, bool read_only) {
  const uintptr_t page = reinterpret_cast<uintptr_t>(word) & ~uintptr_t{4095};
  auto it = g.device_pages.find(page);
  if (it == g.device_pages.end()) {
    void* host = reinterpret_cast<void*>(page);
    const unsigned flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                           (read_only ? CU_MEMHOSTREGISTER_READ_ONLY : 0u);
    const CUresult r = cu()->cuMemHostRegister(host, 4096, flags);
    CUdeviceptr device = 0;
    if ((r != CUDA_SUCCESS && r != CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) ||
        cu()->cuMemHostGetDevicePointer(&device, host, 0) != CUDA_SUCCESS) {
      return 0;
    }
    it = g.device_pages.emplace(page, device).first;
  }
  return it->second + (reinterpret_cast<uintptr_t>(word) - page);
}

// One wait of a barrier: until the word at `address` compares as `flags` says with `value`.
CUstreamBatchMemOpParams wait_op(CUdeviceptr address, uint32_t value, unsigned flags) {
  CUstreamBatchMemOpParams op{};
  op.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  op.waitValue.address = address;
  op.waitValue.value = value;
  op.waitValue.flags = flags;
  return op;
}

// One 64-bit wait: until the two adjacent words at `address` are both 0.
CUstreamBatchMemOpParams wait_pair_op(CUdeviceptr address) {
  CUstreamBatchMemOpParams op{};
  op.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
  op.waitValue.address = address;
  op.waitValue.value64 = 0;
  op.waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
  return op;
}

bool rejected(CUresult r) { return r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_INVALID_VALUE; }

bool has_pair(const CUstreamBatchMemOpParams* ops, unsigned n) {
  return std::any_of(ops, ops + n, [](const CUstreamBatchMemOpParams& op) {
    return op.waitValue.operation == CU_STREAM_MEM_OP_WAIT_VALUE_64;
  });
}

// Queues `ops` on `stream`: in one call where the driver takes it (three waits then cost an
// H100 4.3 us instead of 6.1, and its CPU 1.2 us instead of 2.4: benchmarks/driver_gate/
// barrier_cost.cu), else one by one.
CUresult queue_waits(Gate& g, CUstream stream, CUstreamBatchMemOpParams* ops, unsigned n) {
  if (g.batch_ok.load(std::memory_order_relaxed)) {
    const CUresult r = cu()->cuStreamBatchMemOp(stream, n, ops, 0);
    if (!rejected(r)) {
      return r;
    }
    if (has_pair(ops, n)) {
      return r;  // the 64-bit wait may be what the driver refused: put_barrier tries without
    }
    g.batch_ok.store(false, std::memory_order_relaxed);
  }
  CUresult r = CUDA_SUCCESS;
  for (unsigned i = 0; r == CUDA_SUCCESS && i < n; ++i) {
    const auto& w = ops[i].waitValue;
    r = w.operation == CU_STREAM_MEM_OP_WAIT_VALUE_64
            ? cu()->cuStreamWaitValue64(stream, w.address, w.value64, w.flags)
            : cu()->cuStreamWaitValue32(stream, w.address, static_cast<cuuint32_t>(w.value),
                                        w.flags);
  }
  return r;
}

// The waits of a barrier (see put_barrier) into `ops`; their count, 0 where a word's page could
// not be mapped for the GPU. `pairs`: a watched task's two activity words in one 64-bit wait.
unsigned barrier_waits(Gate& g, uint8_t* ctl, const WatchList* list, bool pairs,
                       CUstreamBatchMemOpParams* ops, BarrierNote* last) {
  const CUdeviceptr own = device_word(g, ctl + kOffGateClosed, false);
  if (own == 0) {
    return 0;
  }
  unsigned n = 0;
  ops[n++] = list != nullptr && list->version != 0
                 ? wait_op(own, ~kClosed, CU_STREAM_WAIT_VALUE_NOR)
                 : wait_op(own, 0, CU_STREAM_WAIT_VALUE_EQ);
  *last = BarrierNote{};
  for (size_t i = 0; list != nullptr && i < list->n; ++i) {
    const uint8_t* b = list->blocks[i];
    const bool hinted = load32(b, kOffHinted) != 0;
    // requests and auto_active are adjacent, requests first and 8-byte aligned
    static_assert(kOffAutoActive == kOffRequests + 4 && kOffRequests % 8 == 0);
    const CUdeviceptr requests = device_word(g, b + kOffRequests, true);
    if (requests == 0) {
      return 0;
    }
    const auto block = static_cast<uint8_t>(i);
    if (!hinted && pairs) {
      ops[n++] = wait_pair_op(requests);
      *last = BarrierNote{list, block, Words::kPair, WordLook{}};
      continue;
    }
    ops[n++] = wait_op(requests, 0, CU_STREAM_WAIT_VALUE_EQ);
    *last = BarrierNote{list, block, Words::kRequests, WordLook{}};
    if (!hinted) {
      ops[n++] = wait_op(requests + 4, 0, CU_STREAM_WAIT_VALUE_EQ);
      *last = BarrierNote{list, block, Words::kActive, WordLook{}};
    }
  }
  return n;
}

}  // namespace

// Waits on the GPU, on `stream`, for this gate's word and the watched tasks' activity words:
// the GPU stops this task's queued work there the moment one says so.
bool put_barrier(Gate& g, uint8_t* ctl, CUstream stream, BarrierNote* note) {
  const WatchList* list = g.watch.load(std::memory_order_acquire);
  if (note != nullptr) {
    *note = BarrierNote{};
  }
  std::array<CUstreamBatchMemOpParams, 1 + 2 * kMaxWatched> ops;
  BarrierNote last;
  unsigned n = barrier_waits(g, ctl, list, g.pair_ok.load(std::memory_order_relaxed), ops.data(),
                             &last);
  if (n == 0) {
    return false;
  }
  // read before the GPU can see the waits: until then it cannot have passed them
  const WatchSample words = note != nullptr ? sample_words(list) : WatchSample{};
  CUresult r = queue_waits(g, stream, ops.data(), n);
  if (rejected(r) && has_pair(ops.data(), n)) {
    // a driver without 64-bit waits: each word in a wait of its own from now on
    g.pair_ok.store(false, std::memory_order_relaxed);
    n = barrier_waits(g, ctl, list, false, ops.data(), &last);
    r = n == 0 ? CUDA_ERROR_INVALID_VALUE : queue_waits(g, stream, ops.data(), n);
  }
  if (r != CUDA_SUCCESS) {
    return false;
  }
  if (note != nullptr) {
    *note = last;
    note->unpassed = look_of(last, words);
  }
  return true;
}

void push_mark(StreamState& st, std::deque<Mark>& line, Mark m, const BarrierNote& note) {
  m.seq = st.next_seq++;
  st.notes[m.seq % kNotes] = note;
  line.push_back(m);
}

void reap(Gate& g, StreamState& st) {
  retire_marks(g, st.context, st.marks, [&](const Mark& first, const Mark& later) {
    if (first.recorded_ns != 0 || !later.gpu_was_busy || later.launches == 0) {
      return;  // from a mark of the gate's thread: the launches since were not all counted
    }
    const double ms = span_ms(first, later);
    if (ms < 0.0) {
      return;
    }
    const double ns = ms * 1e6 / static_cast<double>(later.launches);
    st.ns_per_launch = st.ns_per_launch == 0.0 ? ns : 0.8 * st.ns_per_launch + 0.2 * ns;
    if (uint8_t* ctl = g.ctl.load(std::memory_order_relaxed)) {
      store32(ctl, kOffDriverNsPerLaunch,
              static_cast<uint32_t>(std::min(st.ns_per_launch, 4e9)));
    }
    const double want = g.cfg.barrier_us * 1000.0 / std::max(st.ns_per_launch, 1.0);
    st.spacing = static_cast<uint64_t>(std::clamp(want, 1.0, 4096.0));
  });
}

namespace {

// Whether the stream's work in flight (its launches since its oldest pending mark, at the
// learned GPU time per launch) exceeds the window.
bool over_window(const Gate& g, const StreamState& st) {
  if (st.ns_per_launch <= 0 || st.marks.size() < 2) {
    return false;
  }
  uint64_t launches = st.since_mark;
  for (size_t i = 1; i < st.marks.size(); ++i) {
    launches += st.marks[i].launches;
  }
  return static_cast<double>(launches) * st.ns_per_launch > g.cfg.window_ms * 1e6;
}

}  // namespace

CUevent record_event(Gate& g, CUcontext ctx, CUstream stream, bool timed) {
  CUevent e = take_event(g, ctx, timed);
  if (e != nullptr && cu()->cuEventRecord(e, stream) != CUDA_SUCCESS) {
    give_event(g, ctx, e, timed);
    return nullptr;
  }
  return e;
}

bool record_mark(Gate& g, CUcontext ctx, CUstream stream, const std::deque<Mark>& marks,
                 Mark* out, bool timed) {
  CUevent e = record_event(g, ctx, stream, timed);
  if (e == nullptr) {
    return false;
  }
  *out = Mark{};
  out->event = e;
  out->timed = timed;
  // only a span that starts at a timed mark is learned: the query is for that one
  out->gpu_was_busy = !marks.empty() && marks.back().timed &&
                      cu()->cuEventQuery(marks.back().event) != CUDA_SUCCESS;
  return true;
}

// Mark the stream: a barrier where one holds, an event behind it, and the window enforced. One
// mark in kTimedEvery (every one until the GPU time per launch is known) starts a timed span,
// which the next mark ends with a timed event before its barrier: the time a barrier held the
// stream (for a server's request) is no GPU time of the launches, and counted as such it would
// shrink the barriers' spacing and the window. The check that barriers hold dates a barrier by
// the previous mark's event (driver_verify.cpp), so a mark is one barrier and one event: each
// driver call costs the launching thread 1-3 us, which a trainer whose CPU only keeps pace with
// its GPU pays in speed (benchmarks/driver_gate/mark_profile.patch).
bool mark(Gate& g, uint8_t* ctl, CUstream stream, StreamState& st) {
  const RelaxedCapture relaxed(capture_possible(g));
  const bool ends_span = !st.marks.empty() && st.marks.back().timed;
  BarrierNote note;
  CUevent before = nullptr;
  if (barriers_hold(g, ctl)) {
    if (ends_span) {
      before = record_event(g, st.context, stream, true);
    }
    if (put_barrier(g, ctl, stream, &note)) {
      add64(ctl, kOffDriverBarriers, 1);
    } else if (g.barriers_ok.exchange(false)) {
      // it cannot hold what the process queued: the daemon backs it up, and PyTorch's
      // operator gate no longer stands aside
      publish_state(kDriverFailed);
    }
  }
  // without a barrier before it, the span ends at this mark's own event, which must then be
  // timed (so, without barriers, every mark is)
  const bool timed = st.ns_per_launch == 0.0 || st.next_seq % kTimedEvery == 0 ||
                     (ends_span && before == nullptr);
  Mark m;
  if (!record_mark(g, st.context, stream, st.marks, &m, timed)) {
    give_event(g, st.context, before, true);
    st.since_mark = 0;  // not a barrier at every launch until a mark can be recorded
    return false;
  }
  m.before = before;
  m.launches = st.since_mark;
  push_mark(st, st.marks, m, note);
  st.since_mark = 0;
  // the gate's thread retires completed marks (reap_streams; 3 us a mark here, docs/gate.md):
  // unretired, the work in flight reads high, never low, so a launch retires them only to wait
  if (!over_window(g, st)) {
    return false;
  }
  reap(g, st);
  return over_window(g, st);
}

void reap_streams(Gate& g) {
  const Guard guard;
  std::lock_guard<std::mutex> lock(g.mu);
  const RelaxedCapture relaxed(capture_possible(g));
  for (auto& [key, st] : g.streams) {
    if (st.marks.size() > 1) {
      const CurrentContext current(st.context);
      reap(g, st);
    }
  }
}

void bound_wait(Gate& g, uint8_t* ctl, const StreamKey& key) {
  const NoGil nogil;  // for the whole wait: mu is never held while the GIL is awaited
  for (bool counted = false;; counted = true) {
    {
      std::lock_guard<std::mutex> lock(g.mu);
      auto it = g.streams.find(key);
      if (it == g.streams.end()) {
        return;  // the stream is gone
      }
      StreamState& st = it->second;
      const CurrentContext current(st.context);
      const RelaxedCapture relaxed(capture_possible(g));
      reap(g, st);
      if (!over_window(g, st)) {
        return;
      }
      if (!counted) {
        __atomic_fetch_add(reinterpret_cast<uint32_t*>(ctl + kOffDriverBoundWaits), 1u,
                           __ATOMIC_RELAXED);
      }
    }
    timespec pause{0, kBoundPollNs};
    nanosleep(&pause, nullptr);
  }
}

namespace {

// Destroys the events of a stream the gate forgets, awake and asleep marks' (mu held): each is
// released once its work completed.
void drop_stream(StreamState& st) {
  for (const std::deque<Mark>* marks : {&st.marks, &st.asleep_marks}) {
    for (const Mark& m : *marks) {
      for (CUevent e : {m.event, m.before}) {
        if (e != nullptr) {
          cu()->cuEventDestroy(e);
        }
      }
    }
  }
}

}  // namespace

void forget_stream(CUstream stream) {
  Gate& g = gate();
  const Guard guard;
  std::lock_guard<std::mutex> lock(g.mu);
  auto it = g.streams.find(stream_key(nullptr, stream));  // a stream the program created
  if (it == g.streams.end()) {
    return;
  }
  drop_stream(it->second);
  g.streams.erase(it);
}

void forget_context(Gate& g, CUcontext context) {
  const Guard guard;
  std::lock_guard<std::mutex> lock(g.mu);
  for (auto it = g.streams.begin(); it != g.streams.end();) {
    if (it->second.context == context) {
      drop_stream(it->second);
      it = g.streams.erase(it);
    } else {
      ++it;
    }
  }
  for (auto* spares : {&g.spare_events, &g.spare_plain}) {
    auto it = spares->find(context);
    if (it != spares->end()) {
      for (CUevent e : it->second) {
        cu()->cuEventDestroy(e);
      }
      spares->erase(it);
    }
  }
  // The words' pages may have been registered in this context, which takes the registration
  // with it: the next barrier registers them again (or finds them registered still).
  g.device_pages.clear();
  if (uint8_t* ctl = g.ctl.load(std::memory_order_acquire)) {
    store32(ctl, kOffDriverStreams, static_cast<uint32_t>(g.streams.size()));
  }
}

}  // namespace gpreempt_driver
