// Does a process whose stream waits at a barrier (cuStreamWaitValue32 on a host word) slow
// another process's many small kernels (an eager server)? Modes:
//   server R K G   R requests of K kernels (10 us, 64 blocks) with G us of CPU between launches
//   held T         a stream parked on a wait for T seconds, 1000 kernels queued behind
//   held3 T        the same, parked on three waits (as the gate's barrier)
//   heldfeed T     rounds of: parked, 600 short kernels queued behind the wait one every 15 us
//                  (as a trainer queues behind a barrier during a request), released: does each
//                  submission to a parked channel disturb the server?
//   heldpair T     parked as the gate's barrier parks: one batch of a 32-bit wait that passes
//                  and a 64-bit wait (a server's two activity words) that holds
//   heldpoll T, heldpairpoll T   held, heldpair, with the process asking every 50 us whether
//                  an event behind the queued kernels completed (as a trainer's launching
//                  thread does while its window is full: driver_marks.cpp, bound_wait)
//   busy T         30 us kernels back to back for T seconds
//   idle T         a context, nothing queued, T seconds
//   nvcc -O2 -o parked_channel benchmarks/driver_gate/parked_channel.cu -lcuda; run.sh parked
// runs each mode beside `server 400 160 G` for G of PARKED_GAPS (default 20 and 0: CPU between
// the launches as an eager server has, or none, the GPU busy through each request as a graph's
// replay keeps it), 3 interleaved rounds.
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "spin.cuh"

static void busy_wait(double us) {
  const double end = now_s() + us * 1e-6;
  while (now_s() < end) {
  }
}

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const char* mode = argv[1];
  cudaFree(0);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (!strcmp(mode, "server")) {
    const int R = atoi(argv[2]), K = atoi(argv[3]);
    const double G = atof(argv[4]);
    std::vector<double> t;
    std::mt19937 rng(1);
    for (int r = 0; r < R + 20; ++r) {
      const double t0 = now_s();
      for (int k = 0; k < K; ++k) {
        spin<<<64, 128, 0, s>>>(10000);
        busy_wait(G);
      }
      cudaStreamSynchronize(s);
      const double dt = now_s() - t0;
      if (r >= 20) t.push_back(dt * 1e3);
      std::exponential_distribution<double> gap(1.0 / dt);
      usleep(static_cast<useconds_t>(gap(rng) * 1e6));
    }
    std::sort(t.begin(), t.end());
    double mean = 0;
    for (double x : t) mean += x;
    const double p50 = t[t.size() / 2];
    const auto slow = std::count_if(t.begin(), t.end(), [p50](double x) { return x > 2 * p50; });
    printf("requests %zu: mean %.3f ms, p50 %.3f, p90 %.3f, p99 %.3f, over twice p50 %ld\n",
           t.size(), mean / t.size(), p50, t[t.size() * 9 / 10], t[t.size() * 99 / 100],
           static_cast<long>(slow));
    return 0;
  }
  const double T = atof(argv[2]);
  if (!strncmp(mode, "held", 4)) {
    unsigned* host = nullptr;
    cuMemHostAlloc((void**)&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
    memset(host, 0, 4096);
    const bool pair = strstr(mode, "pair") != nullptr;
    unsigned* const park = pair ? &host[2] : &host[0];  // the word that holds the stream
    *park = 1;
    CUdeviceptr dev;
    cuMemHostGetDevicePointer(&dev, host, 0);
    spin<<<132, 128, 0, s>>>(1000000);
    if (pair) {
      CUstreamBatchMemOpParams ops[2] = {};
      ops[0].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
      ops[0].waitValue.address = dev + 16;  // 0: passes
      ops[0].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
      ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
      ops[1].waitValue.address = dev + 8;  // host[2], host[3]
      ops[1].waitValue.value64 = 0;
      ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
      cuStreamBatchMemOp((CUstream)s, 2, ops, 0);
    } else {
      const int waits = strcmp(mode, "held3") ? 1 : 3;
      for (int i = 0; i < waits; ++i) cuStreamWaitValue32((CUstream)s, dev + 4 * i, 0, CU_STREAM_WAIT_VALUE_EQ);
    }
    for (int i = 0; i < 1000; ++i) spin<<<132, 128, 0, s>>>(30000);
    if (strstr(mode, "poll") != nullptr) {
      cudaEvent_t behind;
      cudaEventCreateWithFlags(&behind, cudaEventDisableTiming);
      cudaEventRecord(behind, s);
      const double end = now_s() + T;
      const timespec pause{0, 50000};
      while (now_s() < end) {
        cudaEventQuery(behind);
        nanosleep(&pause, nullptr);
      }
      __atomic_store_n(park, 0u, __ATOMIC_SEQ_CST);
      cudaStreamSynchronize(s);
      return 0;
    }
    if (!strcmp(mode, "heldfeed")) {
      // rounds: park, queue 600 short kernels over ~9 ms (each one a submission to a parked
      // channel), release, let them run, park again
      const double end = now_s() + T;
      while (now_s() < end) {
        for (int i = 0; i < 600; ++i) {
          spin<<<132, 128, 0, s>>>(1000);
          busy_wait(15);
        }
        __atomic_store_n(&host[0], 0u, __ATOMIC_SEQ_CST);
        cudaStreamSynchronize(s);
        host[0] = 1;
        cuStreamWaitValue32((CUstream)s, dev, 0, CU_STREAM_WAIT_VALUE_EQ);
      }
    } else {
      usleep(static_cast<useconds_t>(T * 1e6));
    }
    __atomic_store_n(&host[0], 0u, __ATOMIC_SEQ_CST);
    cudaStreamSynchronize(s);
  } else if (!strcmp(mode, "busy")) {
    const double end = now_s() + T;
    while (now_s() < end) {
      for (int i = 0; i < 100; ++i) spin<<<132, 128, 0, s>>>(30000);
      cudaStreamSynchronize(s);
    }
  } else {
    usleep(static_cast<useconds_t>(T * 1e6));
  }
  return 0;
}
