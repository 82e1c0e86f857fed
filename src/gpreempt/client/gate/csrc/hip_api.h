// The HIP runtime functions the launch gate's stream barriers use on ROCm builds of PyTorch.
//
// They are looked up at run time in the libamdhip64 the process already loaded (as the CUDA
// path looks up libcuda), so the gate builds without HIP headers on any PyTorch. The types and
// constants below mirror <hip/hip_runtime_api.h>; tests/test_rocm_gate.py compiles a check of
// each one against those headers, and looks the names up in libamdhip64.so.
//
// What HIP requires of a wait (hip_runtime_api.h, hipStreamWaitValue32; CLR
// hipamd/src/hip_stream_ops.cpp, ihipStreamOperation):
//   * support is asked with hipDeviceGetAttribute(hipDeviceAttributeCanUseStreamWaitValue);
//   * `ptr` must belong to a HIP memory object (getMemoryObject, else hipErrorInvalidValue):
//     memory from hipExtMallocWithFlags(hipMallocSignalMemory), or host memory registered with
//     hipHostRegister. With GPU_STREAMOPS_CP_WAIT set (the wait as a CP barrier-value packet)
//     only signal memory is taken (hipErrorInvalidValue otherwise); by default CLR runs the
//     wait as a one-work-item kernel that spins on the word (rocvirtual.cpp,
//     VirtualGPU::submitStreamOperation -> KernelBlitManager::streamOpsWait).
//   * hipHostRegister pins the pages for writing (KFD user pointers are registered writable),
//     so a page mapped read-only cannot be registered.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpreempt_hip {

using Result = int;  // hipError_t (an enum of int size); 0 = hipSuccess

// hipError_t hipStreamWaitValue32(hipStream_t stream, void* ptr, uint32_t value,
//                                 unsigned int flags, uint32_t mask)
using WaitValue32 = Result (*)(void* stream, void* ptr, uint32_t value, unsigned int flags,
                               uint32_t mask);
// hipError_t hipHostRegister(void* hostPtr, size_t sizeBytes, unsigned int flags)
using HostRegister = Result (*)(void* host, size_t bytes, unsigned int flags);
// hipError_t hipHostGetDevicePointer(void** devPtr, void* hstPtr, unsigned int flags)
using HostGetDevicePointer = Result (*)(void** device, void* host, unsigned int flags);

// hipError_t hipGetDevice(int* deviceId)
using GetDevice = Result (*)(int* device);
// hipError_t hipDeviceGetAttribute(int* pi, hipDeviceAttribute_t attr, int deviceId)
using DeviceGetAttribute = Result (*)(int* value, int attribute, int device);

constexpr const char* kWaitValue32Name = "hipStreamWaitValue32";
constexpr const char* kHostRegisterName = "hipHostRegister";
constexpr const char* kHostGetDevicePointerName = "hipHostGetDevicePointer";
constexpr const char* kGetDeviceName = "hipGetDevice";
constexpr const char* kDeviceGetAttributeName = "hipDeviceGetAttribute";

constexpr unsigned int kWaitEq = 0x1;            // hipStreamWaitValueEq: (*ptr & mask) == value
constexpr unsigned int kRegisterPortable = 0x1;  // hipHostRegisterPortable
constexpr unsigned int kRegisterMapped = 0x2;    // hipHostRegisterMapped
constexpr Result kAlreadyRegistered = 712;       // hipErrorHostMemoryAlreadyRegistered
constexpr Result kErrorInvalidValue = 1;         // hipErrorInvalidValue
// hipDeviceAttributeCanUseStreamWaitValue (hipDeviceAttributeAmdSpecificBegin + 13)
constexpr int kAttrCanUseStreamWaitValue = 10013;
constexpr uint32_t kAllBits = 0xFFFFFFFFu;       // the mask HIP applies by default

// Where the runtime is found: the one PyTorch loaded first, by its usual names.
constexpr const char* kLibraries[] = {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6",
                                      "libamdhip64.so.5"};

}  // namespace gpreempt_hip
