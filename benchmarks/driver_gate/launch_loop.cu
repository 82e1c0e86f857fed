// Launches of an empty kernel from C, for launch_cost.py's framework `cuda`: the time the
// launching thread spends in each launch, with no interpreter around it. The launches go in
// batches of 256 on a non-blocking stream, far fewer than the driver queues, and the wait for
// each batch is not timed: what is timed is the host's launch path alone.
#include <cuda_runtime.h>
#include <time.h>

namespace {
__global__ void empty() {}

long long now_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

cudaStream_t stream = nullptr;
}  // namespace

// The mean host time of `n` launches, in ns; -1 where CUDA failed.
extern "C" double launch_ns(int n) {
  if (stream == nullptr && cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != 0) {
    return -1.0;
  }
  long long spent = 0;
  for (int done = 0; done < n;) {
    const int batch = n - done < 256 ? n - done : 256;
    const long long start = now_ns();
    for (int i = 0; i < batch; ++i) {
      empty<<<1, 1, 0, stream>>>();
    }
    spent += now_ns() - start;
    done += batch;
    if (cudaStreamSynchronize(stream) != cudaSuccess) {
      return -1.0;
    }
  }
  return static_cast<double>(spent) / n;
}
