// The operator gate's stream barriers (see operator_gate.h), and their CUDA path: waits on the
// control block words through libcuda's stream memory operations.

#include "operator_gate.h"

namespace gpreempt_gate {

// --- stream barriers ------------------------------------------------------------------------------
// The driver's stream memory operations, looked up in the libcuda the process already loaded
// (declared here: this file builds without CUDA headers). Absent on ROCm and CPU-only builds.
namespace {

using CuResult = int;
using CuDevicePtr = unsigned long long;
constexpr unsigned kWaitEq = 1;              // CU_STREAM_WAIT_VALUE_EQ
constexpr unsigned kWaitNor = 3;             // CU_STREAM_WAIT_VALUE_NOR
constexpr unsigned kRegisterPortable = 1;    // CU_MEMHOSTREGISTER_PORTABLE (every context)
constexpr unsigned kRegisterDeviceMap = 2;   // CU_MEMHOSTREGISTER_DEVICEMAP
constexpr unsigned kRegisterReadOnly = 8;    // CU_MEMHOSTREGISTER_READ_ONLY
constexpr CuResult kAlreadyRegistered = 712;  // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED

}  // namespace

struct CuApi {
  CuResult (*wait32)(void*, CuDevicePtr, uint32_t, unsigned) = nullptr;
  CuResult (*host_register)(void*, size_t, unsigned) = nullptr;
  CuResult (*device_pointer)(CuDevicePtr*, void*, unsigned) = nullptr;
  // a thread that has not yet called CUDA (an operator's first, on a new thread) has no
  // current context; the barrier then borrows the device's primary one, PyTorch's own
  CuResult (*ctx_get_current)(void**) = nullptr;
  CuResult (*device_get)(int*, int) = nullptr;
  CuResult (*primary_ctx_retain)(void**, int) = nullptr;
  CuResult (*ctx_push)(void*) = nullptr;
  CuResult (*ctx_pop)(void**) = nullptr;
};

namespace {

template <class F>
F cu_symbol(void* lib, const char* versioned, const char* plain) {
  void* f = dlsym(lib, versioned);
  return reinterpret_cast<F>(f != nullptr ? f : dlsym(lib, plain));
}
template <class F>
F cu_symbol(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

}  // namespace

const CuApi* cu_api() {
  static const CuApi* api = []() -> const CuApi* {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);  // absent: no NVIDIA driver
    if (lib == nullptr) {
      return nullptr;
    }
    auto* a = new CuApi();
    a->wait32 = cu_symbol<decltype(a->wait32)>(lib, "cuStreamWaitValue32_v2", "cuStreamWaitValue32");
    a->host_register =
        cu_symbol<decltype(a->host_register)>(lib, "cuMemHostRegister_v2", "cuMemHostRegister");
    a->device_pointer = cu_symbol<decltype(a->device_pointer)>(
        lib, "cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer");
    a->ctx_get_current = cu_symbol<decltype(a->ctx_get_current)>(lib, "cuCtxGetCurrent");
    a->device_get = cu_symbol<decltype(a->device_get)>(lib, "cuDeviceGet");
    a->primary_ctx_retain =
        cu_symbol<decltype(a->primary_ctx_retain)>(lib, "cuDevicePrimaryCtxRetain");
    a->ctx_push = cu_symbol<decltype(a->ctx_push)>(lib, "cuCtxPushCurrent_v2", "cuCtxPushCurrent");
    a->ctx_pop = cu_symbol<decltype(a->ctx_pop)>(lib, "cuCtxPopCurrent_v2", "cuCtxPopCurrent");
    if (a->wait32 == nullptr || a->host_register == nullptr || a->device_pointer == nullptr ||
        a->ctx_get_current == nullptr || a->device_get == nullptr ||
        a->primary_ctx_retain == nullptr || a->ctx_push == nullptr || a->ctx_pop == nullptr) {
      return nullptr;
    }
    return a;
  }();
  return api;
}

namespace {

// Makes the device's primary context current for the barrier's driver calls on a thread that
// has none, and takes it off again after them (mu held).
class BorrowedContext {
 public:
  BorrowedContext(const CuApi* cu, int device) : cu_(cu) {
    void* current = nullptr;
    if (cu->ctx_get_current(&current) == 0 && current != nullptr) {
      return;
    }
    // retained once per device and kept: PyTorch holds it for the life of the process anyway
    static std::unordered_map<int, void*> primaries;
    void*& primary = primaries[device];
    if (primary == nullptr) {
      int handle = 0;
      check(cu->device_get(&handle, device), "cuDeviceGet");
      check(cu->primary_ctx_retain(&primary, handle), "cuDevicePrimaryCtxRetain");
    }
    check(cu->ctx_push(primary), "cuCtxPushCurrent");
    pushed_ = true;
  }
  ~BorrowedContext() {
    if (pushed_) {
      void* popped = nullptr;
      cu_->ctx_pop(&popped);
    }
  }
  BorrowedContext(const BorrowedContext&) = delete;
  BorrowedContext& operator=(const BorrowedContext&) = delete;

 private:
  static void check(CuResult r, const char* what) {
    if (r != 0) {
      throw std::runtime_error(std::string(what) + " failed (driver error " + std::to_string(r) +
                               ")");
    }
  }
  const CuApi* cu_;
  bool pushed_ = false;
};

// The device address of a word of a control block (mu held): its page is registered with the
// driver once and stays registered, so a barrier already queued never reads an unregistered
// page. The session never unmaps a watched block while the gate puts barriers, so an address
// seen here always names the same block.
CuDevicePtr device_word(GateState* g, const CuApi* cu, const uint8_t* word, bool read_only) {
  const uintptr_t page = reinterpret_cast<uintptr_t>(word) & ~(kPage - 1);
  auto it = g->device_pages.find(page);
  if (it == g->device_pages.end()) {
    void* host = reinterpret_cast<void*>(page);
    const unsigned flags =
        kRegisterPortable | kRegisterDeviceMap | (read_only ? kRegisterReadOnly : 0);
    const CuResult r = cu->host_register(host, kPage, flags);
    CuDevicePtr device = 0;
    if ((r != 0 && r != kAlreadyRegistered) || cu->device_pointer(&device, host, 0) != 0) {
      throw std::runtime_error("cannot map a control block for the GPU (driver error " +
                               std::to_string(r) + ")");
    }
    it = g->device_pages.emplace(page, device).first;
  }
  return it->second + (reinterpret_cast<uintptr_t>(word) - page);
}

}  // namespace

// Queues one barrier's waits on `stream` (mu held): the GPU goes past it only while the gate
// is not plainly closed (bit 0 of gate_closed) and no watched task is active. False if the
// stream is being captured (a barrier inside a graph would wait at every replay). Throws if
// the driver refuses.
bool put_waits(GateState* g, const c10::Stream& stream) {
  if (stream_capturing(g->impl, stream)) {
    return false;
  }
  if (g->hip) {
    const HipApi* hip = hip_api();
    if (hip == nullptr) {
      throw std::runtime_error("the HIP runtime offers no hipStreamWaitValue32");
    }
    put_hip_waits(g, hip, stream.native_handle());
    g->barriers_put.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  const CuApi* cu = cu_api();
  if (cu == nullptr) {
    throw std::runtime_error("the CUDA driver offers no stream memory operations");
  }
  const BorrowedContext context(cu, stream.device_index());
  void* handle = stream.native_handle();
  auto wait = [&](CuDevicePtr address, uint32_t value, unsigned how) {
    const CuResult r = cu->wait32(handle, address, value, how);
    if (r != 0) {
      throw std::runtime_error("cuStreamWaitValue32 failed (driver error " + std::to_string(r) +
                               ")");
    }
  };
  // The GPU goes past a closed-while-watched word (2V) only where the CPU would: on a
  // complete list, whose tasks the waits below watch. On an incomplete one it waits for the
  // daemon to open the gate (0), like the CPU. (A barrier put on list V still lets a word 2V'
  // of a newer list through: until the next barrier, the new list's tasks are not waited for.)
  const WatchList* list = g->watch.load(std::memory_order_acquire);
  const uint8_t* own = g->ctl + kOffGateClosed;
  if (list != nullptr && list->version != 0) {
    wait(device_word(g, cu, own, false), ~kClosed, kWaitNor);
  } else {
    wait(device_word(g, cu, own, false), 0, kWaitEq);
  }
  for (size_t i = 0; list != nullptr && i < list->n; ++i) {
    const uint8_t* b = list->blocks[i];
    wait(device_word(g, cu, b + kOffRequests, true), 0, kWaitEq);
    if (load32(b, kOffHinted) == 0) {  // its automatic activity counts too (wants_gpu)
      wait(device_word(g, cu, b + kOffAutoActive, true), 0, kWaitEq);
    }
  }
  g->barriers_put.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// A barrier could not be put (mu held): barriers are off for good, the daemon sees it
// (barriers_on) and the CPU stops for watched tasks again.
void barriers_failed(GateState* g, const std::exception& e) {
  g->barriers.store(false);
  store32(g->ctl, kOffBarriersOn, 0);
  g->next_barrier_work.store(std::numeric_limits<uint64_t>::max());
  g->error = std::string("barrier: ") + e.what();  // events still work: not failed
}

// Puts a barrier on the current stream every `barrier_ns` of estimated work.
void put_barrier(GateState* g, uint64_t work) {
  if (!barriers_hold(g)) {
    // off (the mark then stays at its maximum), or nobody more important is registered on this
    // GPU: nothing to hold for; look again one spacing later, without taking the lock
    if (g->barriers.load(std::memory_order_relaxed)) {
      g->next_barrier_work.store(work + g->barrier_ns, std::memory_order_relaxed);
    }
    return;
  }
  MaybeNoGil nogil;
  const auto lock = lock_without_gil(g->mu, nogil);
  if (work < g->next_barrier_work.load(std::memory_order_relaxed) ||
      !g->barriers.load(std::memory_order_relaxed)) {
    return;  // another thread put this one, or barriers just failed
  }
  g->next_barrier_work.store(work + g->barrier_ns, std::memory_order_relaxed);
  if (!device_usable(g)) {
    return;
  }
  try {
    put_waits(g, g->impl->getStream(g->impl->getDevice()));
  } catch (const std::exception& e) {
    barriers_failed(g, e);
  }
}

}  // namespace gpreempt_gate
