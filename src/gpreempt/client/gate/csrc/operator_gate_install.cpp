// Installing and removing the operator gate (see operator_gate.h), draining its work, and
// its statistics.

#include <pybind11/pybind11.h>

#include "operator_gate.h"

namespace gpreempt_gate {

namespace py = pybind11;

namespace {

at::CallbackHandle g_handle = 0;
bool g_atfork_registered = false;

// --- the module's functions ----------------------------------------------------------------------
// The settings of the Python GateConfig `c`, read by their names (counts at least 1).
Config config_from(const py::handle& c) {
  Config cfg;
  cfg.bound = c.attr("bound").cast<bool>();
  cfg.auto_activity = c.attr("auto_activity").cast<bool>();
  cfg.record_every = std::max<uint64_t>(1, c.attr("record_every").cast<uint64_t>());
  cfg.open_record_every = std::max<uint64_t>(1, c.attr("open_record_every").cast<uint64_t>());
  cfg.window_launches = std::max<uint64_t>(1, c.attr("window_launches").cast<uint64_t>());
  cfg.open_window_launches =
      std::max<uint64_t>(1, c.attr("open_window_launches").cast<uint64_t>());
  cfg.window_ms = c.attr("window_ms").cast<double>();
  cfg.open_window_ms = c.attr("open_window_ms").cast<double>();
  cfg.tight_hold_ms = c.attr("tight_hold_ms").cast<double>();
  const std::string mode = c.attr("mode").cast<std::string>();
  if (mode == "adaptive") {
    cfg.mode = kAdaptive;
  } else if (mode == "tight") {
    cfg.mode = kTight;
  } else if (mode == "open") {
    cfg.mode = kOpen;
  } else {
    throw std::invalid_argument("unknown gate mode: " + mode);
  }
  cfg.idle_grace_ms = c.attr("idle_grace_ms").cast<double>();
  cfg.poll_us = c.attr("poll_us").cast<double>();
  cfg.op_costs = c.attr("op_costs").cast<bool>();
  cfg.asleep_barrier_ms = c.attr("asleep_barrier_ms").cast<double>();
  cfg.asleep_max_drain_ms = c.attr("asleep_max_drain_ms").cast<double>();
  cfg.backlog_hold_s = c.attr("backlog_hold_s").cast<double>();
  return cfg;
}

}  // namespace

// `config`: a GateConfig. `device_live`: CUDA is initialised in this process already.
void install(uintptr_t control_address, int doorbell, const py::object& config,
             bool device_live) {
  const Config cfg = config_from(config);
  if (g_gate.load() != nullptr) {
    throw std::runtime_error("the launch gate is already installed in this process");
  }
  if (g_in_child.load()) {
    throw std::runtime_error("the launch gate cannot be installed in a forked child");
  }
  auto* g = new GateState();  // never freed: an operator on another thread may still read it
  g->cfg = cfg;
  g->ctl = reinterpret_cast<uint8_t*>(control_address);
  g->doorbell = doorbell;
  if (c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
    g->impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  }
  g->device_live.store(device_live && g->impl != nullptr);
  g->seen_generation = load32(g->ctl, kOffGeneration);
  g->next_mark.store(g->cfg.record_every);
  store32(g->ctl, kOffWindow, static_cast<uint32_t>(std::min<uint64_t>(g->cfg.window_launches,
                                                                        UINT32_MAX)));
  if (g->cfg.auto_activity) {
    g->bg = std::thread(activity_loop, g);
  }
  if (!g_atfork_registered) {
    pthread_atfork(nullptr, nullptr, after_fork_in_child);
    g_atfork_registered = true;
  }
  g_gate.store(g, std::memory_order_release);
  g_handle = at::addGlobalCallback(at::RecordFunctionCallback(on_operator, on_operator_end)
                                       .needsInputs(false)
                                       .needsOutputs(false)
                                       .needsIds(false)
                                       .scopes({at::RecordScope::FUNCTION}));
  store32(g->ctl, kOffInstalled, 1);
  g->sleeper = std::thread(sleep_loop, g, g_handle);
}

void uninstall() {
  GateState* g = g_gate.exchange(nullptr);
  if (g == nullptr) {
    return;
  }
  g->uninstalled.store(true);
  if (g->sleeper.joinable() && !g_in_child.load()) {
    g->sleeper.join();  // it re-enables the callback if it had disabled it
  }
  if (g_handle != 0) {
    at::removeCallback(g_handle);
    g_handle = 0;
  }
  store32(g->ctl, kOffInstalled, 0);
  store32(g->ctl, kOffBarriersOn, 0);
  if (g_in_child.load()) {
    return;  // the parent's thread and events do not exist here
  }
  if (g->bg.joinable()) {
    {
      std::lock_guard<std::mutex> lock(g->bg_mu);
      g->bg_stop = true;
    }
    g->bg_cv.notify_one();
    g->bg.join();
  }
  if (g->active.exchange(0) != 0) {
    publish_activity(g);
  }
  std::lock_guard<std::mutex> lock(g->mu);
  if (g->impl != nullptr && !g->failed.load()) {
    try {
      auto destroy = [g](void* ev, c10::DeviceIndex d) {
        if (ev != nullptr) {
          g->impl->destroyEvent(ev, d);
        }
      };
      for (auto& p : g->fifo) destroy(p.event, p.stream.device_index());
      for (auto& smp : g->samples) {
        destroy(smp.before, smp.device);
        destroy(smp.after, smp.device);
      }
      if (g->sample_op != nullptr) destroy(g->sample_before, g->sample_stream.device_index());
      for (auto& e : g->free_events) destroy(e.second, e.first);
      for (auto& k : g->streams) destroy(k.tail, k.stream.device_index());
      if (g->have_done) destroy(g->done.event, g->done.stream.device_index());
    } catch (const std::exception&) {
      // the context may be gone at interpreter exit; nothing to give back then
    }
  }
  g->fifo.clear();
  g->samples.clear();
  g->sample_op = nullptr;
  g->sample_before = nullptr;
  g->sample_open.store(false);
  g->free_events.clear();
  g->streams.clear();
  g->have_done = false;
}

namespace {

GateState* current() {
  GateState* g = g_gate.load();
  if (g == nullptr) {
    throw std::runtime_error("the launch gate is not installed");
  }
  return g;
}

}  // namespace

void drain() {
  GateState* g = g_gate.load();
  if (g == nullptr || g_in_child.load() || !device_usable(g)) {
    return;
  }
  std::lock_guard<std::mutex> lock(g->mu);
  try {
    if (!record_tails(g)) {
      return;
    }
    for (auto& k : g->streams) {
      if (k.tail != nullptr) {
        g->impl->synchronizeEvent(k.tail);
      }
    }
    reap(g);
  } catch (const std::exception& e) {
    note_error(g, "drain", e);
  }
}

py::dict stats() {
  py::dict d;
  GateState* g = g_gate.load();
  d["installed"] = g != nullptr;
  if (g == nullptr) {
    return d;
  }
  d["launches"] = g->launches.load();
  d["waits"] = g->waits.load();
  d["wait_seconds"] = static_cast<double>(g->wait_ns.load()) / 1e9;
  d["bound_waits"] = g->bound_waits.load();
  d["bound_wait_seconds"] = static_cast<double>(g->bound_wait_ns.load()) / 1e9;
  d["events_recorded"] = g->events_recorded.load();
  d["window"] = g->window.load();
  d["tight"] = g->tight_now.load();
  d["auto_active"] = g->active.load() != 0;
  d["activations"] = g->activations.load();
  d["device_live"] = g->device_live.load();
  d["captures"] = g->captures.load();
  d["barriers"] = g->barriers.load();
  d["barriers_put"] = g->barriers_put.load();
  d["barrier_fallbacks"] = g->barrier_fallbacks.load();
  d["asleep"] = g->asleep.load();
  d["sleeps"] = g->sleeps.load();
  d["asleep_barriers"] = g->asleep_barriers.load();
  d["backlog_wakes"] = g->backlog_wakes.load();
  d["asleep_drain_ms"] = g->asleep_drain_ms.load();
  d["asleep_longest_span_ms"] = g->asleep_longest_ms.load();
  const WatchList* list = g->watch.load(std::memory_order_acquire);
  d["watched"] = list != nullptr ? list->n : 0;
  d["watch_version"] = list != nullptr ? list->version : 0;
  size_t in_flight = 0;
  size_t streams = 0;
  double window_ns = 0.0;
  std::string error;
  if (!g_in_child.load()) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(g->mu);
    in_flight = g->fifo.size();
    streams = g->streams.size();
    window_ns = g->window_ns;
    error = g->error;
  }
  d["events_in_flight"] = in_flight;
  d["streams"] = streams;
  d["us_per_launch"] = g->ns_per_launch.load() / 1e3;
  d["window_us"] = window_ns / 1e3;
  d["work_seconds"] = static_cast<double>(g->work_ns.load()) / 1e9;
  // the learned per-operator costs: name, calls, us per call, exact timings, upper bounds
  py::list costs;
  uint64_t taken = 0;
  for (const OpCost& op : g->costs) {
    if (op.key.load() != 0 && op.named.load(std::memory_order_acquire)) {
      costs.append(py::make_tuple(std::string(op.name), op.calls.load(), op.ns.load() / 1e3,
                                  op.samples.load(), op.bounds.load()));
      taken += op.samples.load() + op.bounds.load();
    }
  }
  d["op_costs"] = costs;
  d["samples_taken"] = taken;
  d["samples_dropped"] = g->samples_dropped.load();
  d["error"] = error.empty() ? py::object(py::none()) : py::object(py::str(error));
  d["forked_child"] = g_in_child.load();
  return d;
}

}  // namespace gpreempt_gate
