// What the parts of the driver-level gate's mark cost: a loop of spinning kernels (5 us and
// 30 us, 132 blocks) on one stream, with a mark after every second launch built of each part
// in turn (timed and untimed events, waits on a host-mapped or a device word, one by one or in
// one cuStreamBatchMemOp call, a 64-bit wait on two adjacent words, the gate's mark as it was
// and as it is). Per mark against no mark, by the median of 4 interleaved rounds: the wall
// time of the loop with its GPU work (what the GPU loses), and the loop's CPU time where it
// does not wait for the GPU. The gate's marks now are the last row (beside a server that does
// not mark its requests; one that does needs no 64-bit wait), and one in 32 adds two timed
// events.
//   nvcc -O2 -o barrier_cost benchmarks/driver_gate/barrier_cost.cu -lcuda && ./barrier_cost
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
#include <algorithm>

#include "spin.cuh"

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { printf("err %d at %s\n", r_, #x); exit(1);} } while (0)

int main() {
  const int N = 4000, S = 2;
  cudaFree(0);
  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  unsigned* host = nullptr;
  CK(cuMemHostAlloc((void**)&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  memset(host, 0, 4096);
  CUdeviceptr hdev;
  CK(cuMemHostGetDevicePointer(&hdev, host, 0));
  CUdeviceptr ddev;
  CK(cuMemAlloc(&ddev, 4096));
  CK(cuMemsetD8(ddev, 0, 4096));
  std::vector<CUevent> evt(2 * N), evd(2 * N);
  for (auto& e : evt) CK(cuEventCreate(&e, CU_EVENT_DEFAULT));
  for (auto& e : evd) CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  const char* names[] = {"none", "ev-timing x2", "ev-notiming x2", "wait-host x1", "wait-host x3",
                         "batch-host x3", "wait-dev x3", "ev+3w+ev (earlier)", "ev+batch3+ev",
                         "batch3+untimed ev (before)", "wait-host64 x1", "batch 32+64",
                         "batch 32+64+untimed ev (now)"};
  const int V = sizeof(names) / sizeof(names[0]);
  CUstreamBatchMemOpParams ops[3];
  memset(ops, 0, sizeof(ops));
  for (int k = 0; k < 3; ++k) {
    ops[k].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    ops[k].waitValue.address = hdev + 4 * k;
    ops[k].waitValue.value = 0;
    ops[k].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
  }
  // the gate's barrier beside a server that does not mark its requests: its own word, then the
  // server's two activity words in one 64-bit wait
  CUstreamBatchMemOpParams pair[2];
  memset(pair, 0, sizeof(pair));
  pair[0] = ops[0];
  pair[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
  pair[1].waitValue.address = hdev + 8;
  pair[1].waitValue.value64 = 0;
  pair[1].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
  auto put = [&](int v, int& ei) {
    switch (v) {
      case 0: break;
      case 1: CK(cuEventRecord(evt[ei++], s)); CK(cuEventRecord(evt[ei++], s)); break;
      case 2: CK(cuEventRecord(evd[ei++], s)); CK(cuEventRecord(evd[ei++], s)); break;
      case 3: CK(cuStreamWaitValue32(s, hdev, 0, CU_STREAM_WAIT_VALUE_EQ)); break;
      case 4:
        for (int k = 0; k < 3; ++k) CK(cuStreamWaitValue32(s, hdev + 4 * k, 0, CU_STREAM_WAIT_VALUE_EQ));
        break;
      case 5: CK(cuStreamBatchMemOp(s, 3, ops, 0)); break;
      case 6:
        for (int k = 0; k < 3; ++k) CK(cuStreamWaitValue32(s, ddev + 4 * k, 0, CU_STREAM_WAIT_VALUE_EQ));
        break;
      case 7:
        CK(cuEventRecord(evt[ei++], s));
        for (int k = 0; k < 3; ++k) CK(cuStreamWaitValue32(s, hdev + 4 * k, 0, CU_STREAM_WAIT_VALUE_EQ));
        CK(cuEventRecord(evt[ei++], s));
        break;
      case 8:
        CK(cuEventRecord(evt[ei++], s));
        CK(cuStreamBatchMemOp(s, 3, ops, 0));
        CK(cuEventRecord(evt[ei++], s));
        break;
      case 9: CK(cuStreamBatchMemOp(s, 3, ops, 0)); CK(cuEventRecord(evd[ei++], s)); break;
      case 10: CK(cuStreamWaitValue64(s, hdev + 8, 0, CU_STREAM_WAIT_VALUE_EQ)); break;
      case 11: CK(cuStreamBatchMemOp(s, 2, pair, 0)); break;
      case 12: CK(cuStreamBatchMemOp(s, 2, pair, 0)); CK(cuEventRecord(evd[ei++], s)); break;
    }
  };
  auto med = [](std::vector<double> x) { std::sort(x.begin(), x.end()); return (x[1] + x[2]) / 2; };
  // The GPU's share: the loop and its GPU work, the GPU the bottleneck.
  for (unsigned long long kns : {5000ull, 30000ull}) {
    std::vector<std::vector<double>> wall(V);
    for (int rep = 0; rep < 4; ++rep) {
      for (int v = 0; v < V; ++v) {
        CK(cuStreamSynchronize(s));
        int ei = 0;
        const double t0 = now_s();
        for (int i = 0; i < N; ++i) {
          spin<<<132, 128, 0, (cudaStream_t)s>>>(kns);
          if ((i + 1) % S == 0) put(v, ei);
        }
        CK(cuStreamSynchronize(s));
        wall[v].push_back(now_s() - t0);
      }
    }
    const int marks = N / S;
    printf("GPU: kernels of %llu us, %d launches, a mark every %d; per mark against none:\n",
           kns / 1000, N, S);
    for (int v = 0; v < V; ++v) {
      printf("  %-24s %8.2f ms  +%6.2f us\n", names[v], med(wall[v]) * 1e3,
             (med(wall[v]) - med(wall[0])) * 1e6 / marks);
    }
  }
  // The CPU's share: the same loop queued behind a 50 ms kernel, so that no call waits for
  // the GPU (a loop that outruns its GPU blocks in the launches, which hides the marks' cost).
  const int M = 400;
  std::vector<std::vector<double>> cpu(V);
  for (int rep = 0; rep < 4; ++rep) {
    for (int v = 0; v < V; ++v) {
      CK(cuStreamSynchronize(s));
      spin<<<132, 128, 0, (cudaStream_t)s>>>(50000000ull);
      int ei = 0;
      const double t0 = now_s();
      for (int i = 0; i < M; ++i) {
        spin<<<132, 128, 0, (cudaStream_t)s>>>(1000ull);
        if ((i + 1) % S == 0) put(v, ei);
      }
      cpu[v].push_back(now_s() - t0);
    }
  }
  CK(cuStreamSynchronize(s));
  printf("CPU: %d launches queued behind a 50 ms kernel, a mark every %d; per mark against none:\n",
         M, S);
  for (int v = 0; v < V; ++v) {
    printf("  %-24s %8.3f ms  +%6.2f us\n", names[v], med(cpu[v]) * 1e3,
           (med(cpu[v]) - med(cpu[0])) * 1e6 / (M / S));
  }
  return 0;
}
