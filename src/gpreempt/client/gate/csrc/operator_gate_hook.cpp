// The operator gate's per-operator path (see operator_gate.h): the RecordFunction callbacks,
// the learned cost of each operator, and the in-process task words.

#include "operator_gate.h"

namespace gpreempt_gate {

std::atomic<GateState*> g_gate{nullptr};
std::atomic<bool> g_in_child{false};

// Set once a scheduler binds a thread or a default word: until then the per-launch path reads
// no thread-local state (a TLS access from a loaded extension is a function call).
std::atomic<bool> g_task_gates{false};

namespace {

// In-process task gates (gpreempt.GPUScheduler): a thread bound to a task waits while its
// task's word is nonzero; threads bound to no task (PyTorch's autograd workers among them)
// follow the default word, if the scheduler set one. Unbounded threads (tasks that are never
// preempted in-process) keep out of the in-flight window.
thread_local const uint32_t* tls_task_word = nullptr;
thread_local bool tls_task_unbounded = false;
std::atomic<const uint32_t*> g_default_task_word{nullptr};

// --- per-operator cost ----------------------------------------------------------------------------
// The name's hash (FNV-1a), never 0. Names are hashed by content: an operator's name pointer is
// stable, but a scope named by a string owns its copy and the address is reused.
inline uint64_t name_key(const char* name) {
  uint64_t h = 1469598103934665603ull;
  for (const char* c = name; *c != '\0'; ++c) {
    h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  }
  return h == 0 ? 1 : h;
}

// The name's slot, claimed on first sight; null if the table has no room near its hash.
OpCost* find_cost(GateState* g, const char* name) {
  const uint64_t key = name_key(name);
  size_t i = static_cast<size_t>(key) & (kCostSlots - 1);
  for (size_t probe = 0; probe < kCostProbes; ++probe, i = (i + 1) & (kCostSlots - 1)) {
    OpCost& slot = g->costs[i];
    uint64_t seen = slot.key.load(std::memory_order_acquire);
    if (seen == key) {
      return &slot;
    }
    if (seen == 0) {
      if (slot.key.compare_exchange_strong(seen, key, std::memory_order_acq_rel)) {
        std::strncpy(slot.name, name, kCostNameLen - 1);
        slot.named.store(true, std::memory_order_release);
        return &slot;
      }
      if (seen == key) {
        return &slot;
      }
    }
  }
  return nullptr;
}

// Whether to time this call of the operator: the first calls until four exact timings came,
// then one call in 256 (costs drift little).
inline bool sample_due(OpCost* op) {
  const uint32_t calls = op->calls.fetch_add(1, std::memory_order_relaxed) + 1;
  return (calls <= 64 && op->samples.load(std::memory_order_relaxed) < 4) || (calls & 255) == 0;
}

// `name`: the operator's, or null for work RecordFunction does not see (graph replays).
inline void before_launch(GateState* g, const char* name) {
  const uint64_t n = g->launches.fetch_add(1) + 1;
  if (C10_UNLIKELY(g->sample_open.load(std::memory_order_acquire))) {
    // the previous operator was being timed: this one ends its span, before any wait below
    // (which must not count in it)
    finish_sample(g);
  }
  if (C10_UNLIKELY(must_wait(g, load32(g->ctl, kOffGateClosed),
                             g->watch.load(std::memory_order_acquire)))) {
    wait_open(g, reinterpret_cast<const uint32_t*>(g->ctl + kOffGateClosed), true, true);
  }
  if (C10_UNLIKELY(g_task_gates.load(std::memory_order_relaxed))) {
    const uint32_t* task_word = tls_task_word;
    if (task_word == nullptr) {
      task_word = g_default_task_word.load(std::memory_order_relaxed);
    }
    if (task_word != nullptr && __atomic_load_n(task_word, __ATOMIC_RELAXED) != 0) {
      wait_open(g, task_word, false, false);
    }
    if (tls_task_unbounded) {
      return;
    }
  }
  // costs matter only to a bounded gate: an unbounded one (a task that preempts) skips them
  OpCost* op = name != nullptr && g->cfg.op_costs && g->cfg.bound ? find_cost(g, name) : nullptr;
  uint64_t cost = op != nullptr ? op->ns.load(std::memory_order_relaxed) : 0;
  if (cost == 0) {
    cost = static_cast<uint64_t>(g->ns_per_launch.load(std::memory_order_relaxed));
  }
  const uint64_t work = g->work_ns.fetch_add(cost, std::memory_order_relaxed);
  if (C10_UNLIKELY(work >= g->next_barrier_work.load(std::memory_order_relaxed))) {
    put_barrier(g, work);
  }
  if (g->cfg.auto_activity && C10_UNLIKELY(g->active.load() == 0) && !activity_handed_now(g)) {
    mark_active(g);
    // learn the stream now: a short burst may never reach a segment boundary
    segment(g, n, work, cost, true);
  } else if (C10_UNLIKELY(n >= g->next_mark.load(std::memory_order_relaxed) ||
                          work + cost >= g->next_work_mark.load(std::memory_order_relaxed))) {
    segment(g, n, work, cost, false);
  }
  if (op != nullptr && C10_UNLIKELY(sample_due(op))) {
    start_sample(g, op);
  }
}

}  // namespace

std::unique_ptr<at::ObserverContext> on_operator(const at::RecordFunction& fn) {
  GateState* g = g_gate.load(std::memory_order_acquire);
  if (C10_LIKELY(g != nullptr) && !g_in_child.load(std::memory_order_relaxed)) {
    before_launch(g, fn.name());
  }
  return nullptr;
}

// An operator ended: if it is the one being timed (no nested operator began meanwhile), its
// timing ends here rather than at the next operator, after whatever the caller does between.
void on_operator_end(const at::RecordFunction& /*fn*/, at::ObserverContext* /*ctx*/) {
  GateState* g = g_gate.load(std::memory_order_acquire);
  if (C10_LIKELY(g != nullptr) && C10_UNLIKELY(g->sample_open.load(std::memory_order_acquire)) &&
      !g_in_child.load(std::memory_order_relaxed) &&
      pthread_equal(g->sample_thread.load(std::memory_order_relaxed), pthread_self())) {
    finish_sample(g);
  }
}

// Launches RecordFunction does not see (CUDA graph replays).
void before_graph_replay() {
  GateState* g = g_gate.load();
  if (g != nullptr && !g_in_child.load()) {
    before_launch(g, "gpreempt::graph_replay");
  }
}

void bind_thread(uintptr_t word, bool unbounded) {
  if (word != 0) {
    g_task_gates.store(true);
  }
  tls_task_word = reinterpret_cast<const uint32_t*>(word);
  tls_task_unbounded = word != 0 && unbounded;
}

void set_default_task_word(uintptr_t word) {
  if (word != 0) {
    g_task_gates.store(true);
  }
  g_default_task_word.store(reinterpret_cast<const uint32_t*>(word));
}

// --- fork safety --------------------------------------------------------------------------------
void after_fork_in_child() {
  // A forked child (a DataLoader worker) has neither the parent's CUDA context nor its
  // background thread; the gate stays out of its way for good.
  g_in_child.store(true);
}

}  // namespace gpreempt_gate
