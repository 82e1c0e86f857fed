// The operator gate's stream barriers through HIP (ROCm builds of PyTorch; see operator_gate.h).

#include "operator_gate.h"

#include "hip_api.h"

namespace gpreempt_gate {

// --- stream barriers through HIP (ROCm builds of PyTorch) --------------------------------------
// The same waits on the same words as the CUDA path below, through the HIP runtime's
// hipStreamWaitValue32 (see hip_api.h). HIP has no current-context rule to satisfy: a stream
// carries its device.
struct HipApi {
  gpreempt_hip::WaitValue32 wait32 = nullptr;
  gpreempt_hip::HostRegister host_register = nullptr;
  gpreempt_hip::HostGetDevicePointer device_pointer = nullptr;
  gpreempt_hip::GetDevice get_device = nullptr;
  gpreempt_hip::DeviceGetAttribute device_attribute = nullptr;
};

// The API from one library (a handle from dlopen), or null if a function is missing.
const HipApi* hip_api_from(void* lib) {
  if (lib == nullptr) {
    return nullptr;
  }
  auto* a = new HipApi();  // kept for the life of the process, like the library
  a->wait32 = reinterpret_cast<gpreempt_hip::WaitValue32>(dlsym(lib, gpreempt_hip::kWaitValue32Name));
  a->host_register =
      reinterpret_cast<gpreempt_hip::HostRegister>(dlsym(lib, gpreempt_hip::kHostRegisterName));
  a->device_pointer = reinterpret_cast<gpreempt_hip::HostGetDevicePointer>(
      dlsym(lib, gpreempt_hip::kHostGetDevicePointerName));
  a->get_device =
      reinterpret_cast<gpreempt_hip::GetDevice>(dlsym(lib, gpreempt_hip::kGetDeviceName));
  a->device_attribute = reinterpret_cast<gpreempt_hip::DeviceGetAttribute>(
      dlsym(lib, gpreempt_hip::kDeviceGetAttributeName));
  if (a->wait32 == nullptr || a->host_register == nullptr || a->device_pointer == nullptr ||
      a->get_device == nullptr || a->device_attribute == nullptr) {
    delete a;
    return nullptr;
  }
  return a;
}

// The HIP runtime PyTorch loaded (never a second copy if one is loaded already); null without.
const HipApi* hip_api() {
  static const HipApi* api = []() -> const HipApi* {
    for (const char* name : gpreempt_hip::kLibraries) {
      if (void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
        return hip_api_from(lib);
      }
    }
    for (const char* name : gpreempt_hip::kLibraries) {
      if (void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
        return hip_api_from(lib);
      }
    }
    return nullptr;
  }();
  return api;
}

// Whether the current device runs hipStreamWaitValue32, as HIP says to ask it
// (hipDeviceAttributeCanUseStreamWaitValue); `why` says why not.
bool hip_waits_supported(const HipApi* hip, std::string* why) {
  int device = 0;
  int value = 0;
  gpreempt_hip::Result r = hip->get_device(&device);
  if (r == 0) {
    r = hip->device_attribute(&value, gpreempt_hip::kAttrCanUseStreamWaitValue, device);
  }
  if (r != 0) {
    *why = "hipDeviceGetAttribute(hipDeviceAttributeCanUseStreamWaitValue) failed (HIP error " +
           std::to_string(r) + "): this HIP runtime cannot say whether it runs stream waits";
    return false;
  }
  if (value == 0) {
    *why = "device " + std::to_string(device) +
           " cannot run hipStreamWaitValue32 (hipDeviceAttributeCanUseStreamWaitValue is 0)";
    return false;
  }
  return true;
}

namespace {

// The device address of a control block word for HIP (mu held), or null where HIP cannot map
// its page: the page is registered once (mapped, portable) and stays registered, as on the
// CUDA path, and a refusal is remembered (address 0) so that it is not asked again. HIP pins
// the page for writing, so the page of a watched block, mapped read-only, is refused.
void* hip_device_word(GateState* g, const HipApi* hip, const uint8_t* word) {
  const uintptr_t page = reinterpret_cast<uintptr_t>(word) & ~(kPage - 1);
  auto it = g->device_pages.find(page);
  if (it == g->device_pages.end()) {
    void* host = reinterpret_cast<void*>(page);
    const gpreempt_hip::Result r = hip->host_register(
        host, kPage, gpreempt_hip::kRegisterPortable | gpreempt_hip::kRegisterMapped);
    void* device = nullptr;
    if ((r != 0 && r != gpreempt_hip::kAlreadyRegistered) ||
        hip->device_pointer(&device, host, 0) != 0) {
      device = nullptr;
    }
    it = g->device_pages.emplace(page, reinterpret_cast<uintptr_t>(device)).first;
  }
  if (it->second == 0) {
    return nullptr;
  }
  return reinterpret_cast<void*>(it->second + (reinterpret_cast<uintptr_t>(word) - page));
}

}  // namespace

// Queues the barrier's waits on `stream` (a hipStream_t; mu held): the gate's own word with
// bit 0 clear (on a complete watch list) or zero, then each watched task's activity words at
// zero. The CUDA path waits for bit 0 with WAIT_VALUE_NOR; here an equality under the mask
// 0x1 says the same, without relying on HIP's NOR.
//
// Where HIP cannot map a watched block's page (read-only, see hip_device_word), the GPU cannot
// read that task's activity: the barrier then waits for the own word at zero alone, i.e. for
// the daemon to open the gate, which holds the GPU through the whole suspension rather than
// only while the watched tasks are active, and the daemon's latency replaces the GPU's. Each
// such barrier is counted (stats: barrier_fallbacks), and the first one said on stderr.
void put_hip_waits(GateState* g, const HipApi* hip, void* stream) {
  auto wait = [&](void* address, uint32_t mask) {
    const gpreempt_hip::Result r = hip->wait32(stream, address, 0, gpreempt_hip::kWaitEq, mask);
    if (r == gpreempt_hip::kErrorInvalidValue) {
      throw std::runtime_error(
          "hipStreamWaitValue32 refused the control block (hipErrorInvalidValue): this HIP "
          "runtime waits only on memory from hipMallocSignalMemory (GPU_STREAMOPS_CP_WAIT set, "
          "or an older CLR)");
    }
    if (r != 0) {
      throw std::runtime_error("hipStreamWaitValue32 failed (HIP error " + std::to_string(r) +
                               ")");
    }
  };
  const WatchList* list = g->watch.load(std::memory_order_acquire);
  const uint8_t* own = g->ctl + kOffGateClosed;
  const bool complete = list != nullptr && list->version != 0;
  void* own_word = hip_device_word(g, hip, own);
  if (own_word == nullptr) {
    throw std::runtime_error("HIP cannot map this process's control block for the GPU "
                             "(hipHostRegister refused its page)");
  }
  std::vector<void*> watched;
  bool unreadable = false;
  for (size_t i = 0; list != nullptr && i < list->n && !unreadable; ++i) {
    const uint8_t* b = list->blocks[i];
    watched.push_back(hip_device_word(g, hip, b + kOffRequests));
    if (load32(b, kOffHinted) == 0) {  // its automatic activity counts too (wants_gpu)
      watched.push_back(hip_device_word(g, hip, b + kOffAutoActive));
    }
    unreadable = watched.back() == nullptr;  // both words lie on the block's one page
  }
  if (unreadable) {
    if (g->barrier_fallbacks.fetch_add(1, std::memory_order_relaxed) == 0) {
      std::fprintf(stderr,
                   "gpreempt: HIP cannot map a watched task's control block (read-only) for the "
                   "GPU: stream barriers wait for the daemon to open the gate instead\n");
    }
    wait(own_word, gpreempt_hip::kAllBits);
    return;
  }
  wait(own_word, complete ? kClosed : gpreempt_hip::kAllBits);
  for (void* address : watched) {
    wait(address, gpreempt_hip::kAllBits);
  }
}

}  // namespace gpreempt_gate
