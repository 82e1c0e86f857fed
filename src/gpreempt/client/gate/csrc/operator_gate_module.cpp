// The operator gate's Python module (see operator_gate.h): one per build, TORCH_EXTENSION_NAME.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "operator_gate.h"

namespace py = pybind11;

namespace gpreempt_gate {

// operator_gate_install.cpp
void install(uintptr_t control_address, int doorbell, const py::object& config,
             bool device_live);
void uninstall();
void drain();
py::dict stats();

}  // namespace gpreempt_gate

using namespace gpreempt_gate;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "gpreempt's in-process launch gate (a RecordFunction callback)";
  m.def("install", &install, py::arg("control_address"), py::arg("doorbell"), py::arg("config"),
        py::arg("device_live"));
  m.def("uninstall", &uninstall, py::call_guard<py::gil_scoped_release>());
  m.def("drain", &drain, py::call_guard<py::gil_scoped_release>());
  m.def("stats", &stats);
  m.def("set_device_live", [](bool live) {
    GateState* g = g_gate.load();
    if (g != nullptr) {
      g->device_live.store(live && g->impl != nullptr);
    }
  });
  m.def("capture_begin", []() {
    GateState* g = g_gate.load();
    if (g != nullptr) {
      g->captures.fetch_add(1);
    }
  });
  m.def("capture_end", []() {
    GateState* g = g_gate.load();
    if (g != nullptr && g->captures.load() > 0) {
      g->captures.fetch_sub(1);
    }
  });
  // The driver-level gate publishes auto_active from now (handed), or no longer: this gate's
  // own activity is written again. False where no gate is installed.
  m.def("hand_activity", [](bool handed) {
    GateState* g = g_gate.load();
    if (g == nullptr) {
      return false;
    }
    std::lock_guard<std::mutex> lock(g->publish_mu);
    g->activity_handed.store(handed);
    if (!handed) {
      set_activity_word(g->ctl, kOffAutoActive, g->active.load());
      ring(g);
    }
    return true;
  });
  // for launches RecordFunction does not see (CUDA graph replays)
  m.def("before_launch", &before_graph_replay);
  m.def("in_forked_child", []() { return g_in_child.load(); });
  // `hip`: a ROCm build of PyTorch (torch.version.hip), whose barriers go through HIP
  m.def(
      "set_barriers",
      [](double barrier_ms, bool hip) {
        GateState* g = g_gate.load();
        if (g == nullptr || g->impl == nullptr || !g->cfg.bound) {
          return false;
        }
        bool on = barrier_ms > 0.0 && (hip ? hip_api() != nullptr : cu_api() != nullptr);
        std::string refused;
        if (hip && barrier_ms > 0.0) {  // HIP's own test, and never a silent refusal
          if (!on) {
            refused = "the HIP runtime offers no hipStreamWaitValue32";
          } else if (!hip_waits_supported(hip_api(), &refused)) {
            on = false;
          }
        }
        MaybeNoGil nogil;
        const auto lock = lock_without_gil(g->mu, nogil);
        if (!refused.empty()) {
          g->error = "barrier: " + refused;  // events still work: not failed
        }
        g->hip = hip;
        g->barrier_ns = static_cast<uint64_t>(std::max(0.0, barrier_ms) * 1e6);
        g->barriers.store(on);
        store32(g->ctl, kOffBarriersOn, on ? 1u : 0u);  // the daemon's backstop leaves it alone
        g->next_barrier_work.store(on ? g->work_ns.load()
                                      : std::numeric_limits<uint64_t>::max());
        return on;
      },
      py::arg("barrier_ms"), py::arg("hip") = false);
  // Tests: queue one barrier's HIP waits on `stream` through the HIP library at `library` (a
  // fake that records its calls, on machines without ROCm), for the control block at `own`
  // watching the blocks at `watched` (list `version`). Returns the number of pages asked for
  // and the barriers that fell back to the own word alone.
  m.def("_hip_waits_for_test", [](const std::string& library, uintptr_t stream, uintptr_t own,
                                  const std::vector<uintptr_t>& watched, uint32_t version) {
    const HipApi* hip = hip_api_from(dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL));
    if (hip == nullptr) {
      throw std::runtime_error(library + " does not offer the HIP functions the gate uses");
    }
    auto g = std::make_unique<GateState>();
    g->ctl = reinterpret_cast<uint8_t*>(own);
    WatchList list;
    for (uintptr_t a : watched) {
      if (list.n < kMaxWatched) {
        list.blocks[list.n++] = reinterpret_cast<const uint8_t*>(a);
      }
    }
    list.version = version;
    g->watch.store(watched.empty() ? nullptr : &list);
    std::lock_guard<std::mutex> lock(g->mu);
    put_hip_waits(g.get(), hip, reinterpret_cast<void*>(stream));
    return py::make_tuple(g->device_pages.size(), g->barrier_fallbacks.load());
  });
  // Tests: whether the HIP library at `library` says the current device runs stream waits,
  // and why not.
  m.def("_hip_support_for_test", [](const std::string& library) {
    const HipApi* hip = hip_api_from(dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL));
    if (hip == nullptr) {
      throw std::runtime_error(library + " does not offer the HIP functions the gate uses");
    }
    std::string why;
    const bool ok = hip_waits_supported(hip, &why);
    return py::make_tuple(ok, why);
  });
  m.def("watch", [](const std::vector<uintptr_t>& addresses, uint32_t version) {
    GateState* g = g_gate.load();
    if (g == nullptr) {
      return;
    }
    const WatchList* list = nullptr;
    if (!addresses.empty()) {
      auto* fresh = new WatchList();  // never freed: a thread may still read the old one
      for (uintptr_t a : addresses) {
        if (fresh->n < kMaxWatched && a != 0) {
          fresh->blocks[fresh->n++] = reinterpret_cast<const uint8_t*>(a);
        }
      }
      // a list cut short is not the one the daemon versioned
      fresh->version = fresh->n == addresses.size() ? version : 0;
      list = fresh;
    }
    g->watch.store(list, std::memory_order_release);
  });
  m.def("bind_thread", &bind_thread);
  m.def("set_default_task_word", &set_default_task_word);
}
