// A training-like CUDA C++ program for the benchmark (gpreempt bench --case-b-cmd): each step
// launches 32 kernels that keep every SM busy for about 0.3 ms each (a step is about 10 ms of
// GPU time, as a GEMM-heavy step of a small model), waits for them, and appends the time to
// $GPREEMPT_BENCH_STEPS_FILE. It touches $GPREEMPT_BENCH_READY_FILE once warmed up and stops on
// SIGTERM. No Python anywhere: only the driver-level gate can hold it.
#include <cuda_runtime.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>

static volatile sig_atomic_t stop = 0;

__global__ void busy(float* out, long long spin) {
  const long long start = clock64();
  float acc = threadIdx.x;
  while (clock64() - start < spin) {
    acc = acc * 0.999f + 1.0f;
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

int main() {
  std::signal(SIGTERM, [](int) { stop = 1; });
  const char* steps_path = std::getenv("GPREEMPT_BENCH_STEPS_FILE");
  const char* ready_path = std::getenv("GPREEMPT_BENCH_READY_FILE");
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int blocks = sms * 2, threads = 512;
  float* out = nullptr;
  if (cudaMalloc(&out, sizeof(float) * blocks * threads) != cudaSuccess) {
    return 1;
  }
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  FILE* steps = steps_path ? std::fopen(steps_path, "a") : nullptr;
  for (int i = 0; !stop; ++i) {
    for (int k = 0; k < 32; ++k) {
      busy<<<blocks, threads, 0, stream>>>(out, 500000);
    }
    if (cudaStreamSynchronize(stream) != cudaSuccess) {
      return 1;
    }
    if (i == 20 && ready_path != nullptr) {
      if (FILE* f = std::fopen(ready_path, "w")) {
        std::fclose(f);
      }
    }
    if (steps != nullptr && i >= 20) {
      timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      std::fprintf(steps, "%.6f\n", ts.tv_sec + ts.tv_nsec * 1e-9);
      std::fflush(steps);
    }
  }
  return 0;
}
