// A CUDA C++ program that is not Python at all, for the driver-level gate's GPU tests: it
// launches short kernels that count on a counter in host-mapped memory, so its GPU progress
// can be read without a CUDA call, and writes that count to a file every 20 ms.
//   kernel_loop PROGRESS_FILE MODE SECONDS
// MODE: default (the legacy default stream, waiting for it every 64 kernels: about 2 ms of GPU
// work queued in a moment), paced (the same, waiting every 4: its CPU keeps pace with its GPU),
// streams (two non-blocking streams), threads (two threads, each its own stream), graph (a
// captured graph of 16 kernels, replayed), deep (one stream, queued about 0.25 s ahead of the
// GPU, as JAX or CuPy run ahead), idle (default, then as long again alive without launching,
// as a trainer waiting on its input), devices (one thread driving every visible GPU in turn,
// each on its legacy default stream and on a stream of its own, as a process of single-process
// data parallelism does; the count is their sum), reset (default for 0.3 s, then
// cudaDeviceReset, which destroys the context, and default in the new one for the rest).
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

__global__ void bump(unsigned long long* counter, long long spin) {
  const long long start = clock64();
  while (clock64() - start < spin) {
  }
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    atomicAdd(counter, 1ULL);
  }
}

static void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: kernel_loop PROGRESS_FILE MODE SECONDS\n");
    return 2;
  }
  const std::string path = argv[1], mode = argv[2];
  const double seconds = std::atof(argv[3]);
  // One counter per GPU (atomics of several GPUs on one word of host memory need not add up),
  // in a page of the program's own, registered portable: mapped into every GPU's context, and
  // still there for the reporter once a reset took the registration (registered again).
  constexpr int kMaxDevices = 16;
  auto* host = static_cast<unsigned long long*>(std::aligned_alloc(4096, 4096));
  std::memset(host, 0, 4096);
  unsigned long long* device = nullptr;
  auto map_counters = [&]() {
    const cudaError_t e =
        cudaHostRegister(host, 4096, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
      cudaGetLastError();  // a reset left the registration: the page is mapped still
    } else {
      check(e, "cudaHostRegister");
    }
    check(cudaHostGetDevicePointer(&device, host, 0), "cudaHostGetDevicePointer");
  };
  map_counters();
  auto count = [&]() {
    unsigned long long sum = 0;
    for (int d = 0; d < kMaxDevices; ++d) {
      sum += reinterpret_cast<volatile unsigned long long*>(host)[d];
    }
    return sum;
  };
  const long long spin = 50000;  // about 30 us
  std::atomic<bool> done{false};
  std::thread reporter([&]() {
    const std::string tmp = path + ".tmp";
    while (!done.load()) {
      if (FILE* f = std::fopen(tmp.c_str(), "w")) {
        std::fprintf(f, "%llu", count());
        std::fclose(f);
        std::rename(tmp.c_str(), path.c_str());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  auto running = [&]() { return std::chrono::steady_clock::now() < end; };
  auto loop_on = [&](cudaStream_t s, int sync_every = 64) {
    for (int i = 0; running(); ++i) {
      bump<<<1, 32, 0, s>>>(device, spin);
      if (i % sync_every == sync_every - 1) {
        check(cudaStreamSynchronize(s), "sync");
      }
    }
    check(cudaStreamSynchronize(s), "sync");
  };
  if (mode == "default") {
    loop_on(0);
  } else if (mode == "paced") {
    loop_on(0, 4);
  } else if (mode == "reset") {
    const auto reset_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (std::chrono::steady_clock::now() < reset_at) {
      bump<<<1, 32>>>(device, spin);
    }
    check(cudaDeviceSynchronize(), "sync");
    check(cudaDeviceReset(), "reset");
    map_counters();
    loop_on(0);
  } else if (mode == "idle") {
    loop_on(0);
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  } else if (mode == "deep") {
    cudaStream_t s;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    loop_on(s, 8192);
  } else if (mode == "streams") {
    cudaStream_t a, b;
    check(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), "stream");
    check(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "stream");
    for (int i = 0; running(); ++i) {
      bump<<<1, 32, 0, (i & 1) ? a : b>>>(device, spin);
      if (i % 64 == 63) {
        check(cudaDeviceSynchronize(), "sync");
      }
    }
    check(cudaDeviceSynchronize(), "sync");
  } else if (mode == "threads") {
    std::thread other([&]() {
      cudaStream_t s;
      check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
      loop_on(s);
    });
    cudaStream_t s;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    loop_on(s);
    other.join();
  } else if (mode == "graph") {
    cudaStream_t s;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "capture");
    for (int i = 0; i < 16; ++i) {
      bump<<<1, 32, 0, s>>>(device, spin);
    }
    check(cudaStreamEndCapture(s, &graph), "end capture");
    check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    for (int i = 0; running(); ++i) {
      check(cudaGraphLaunch(exec, s), "graph launch");
      if (i % 4 == 3) {
        check(cudaStreamSynchronize(s), "sync");
      }
    }
    check(cudaStreamSynchronize(s), "sync");
  } else if (mode == "devices") {
    int n = 0;
    check(cudaGetDeviceCount(&n), "device count");
    n = n < kMaxDevices ? n : kMaxDevices;
    cudaStream_t streams[kMaxDevices];
    for (int d = 0; d < n; ++d) {
      check(cudaSetDevice(d), "set device");
      check(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking), "stream");
    }
    for (int i = 0; running(); ++i) {
      const int d = i % n;
      check(cudaSetDevice(d), "set device");
      bump<<<1, 32, 0, ((i / n) & 1) ? streams[d] : 0>>>(device + d, spin);
      if (i % (64 * n) == 64 * n - 1) {
        for (int e = 0; e < n; ++e) {
          check(cudaSetDevice(e), "set device");
          check(cudaDeviceSynchronize(), "sync");
        }
      }
    }
    for (int d = 0; d < n; ++d) {
      check(cudaSetDevice(d), "set device");
      check(cudaDeviceSynchronize(), "sync");
    }
  } else {
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  }
  done.store(true);
  reporter.join();
  std::printf("%llu\n", count());
  return 0;
}
