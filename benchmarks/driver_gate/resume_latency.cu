// How long a stream parked at a barrier takes to run again once its word drops: what each
// suspension costs a trainer at its end, beside what a plain launch takes. The process parks
// a stream on a 32-bit wait (cuStreamWaitValue32 on a host word, as the gate's barrier waits)
// behind 0.3 ms of its own work, a kernel that raises a host-mapped flag behind the wait; the
// host drops the word and spins until it sees the flag. Modes, taking turns trial by trial:
//   parked-idle    the word drops 1 ms after the stream parked, the GPU idle since
//   parked-other   another process ran 0.5 ms of work (and completed) while the stream was
//                  parked: the GPU must switch back to this process's context
//   launch-idle    no barrier: the flag's kernel is launched 1 ms after this process's work
//   launch-other   the same, after another process's 0.5 ms of work
// Each latency runs from the word's store (or the launch call) to the flag seen by the host.
//   nvcc -O2 -o resume_latency benchmarks/driver_gate/resume_latency.cu -lcuda
//   ./resume_latency [TRIALS]   (run.sh resume)
#include <cuda.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "spin.cuh"

__global__ void raise_flag(volatile unsigned* flag) {
  *flag = 1;
  __threadfence_system();
}

static void other_process(int in, int out) {  // runs 0.5 ms of work on each request
  cudaFree(0);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  char c;
  while (read(in, &c, 1) == 1 && c == 's') {
    spin<<<132, 128, 0, s>>>(500000);
    cudaStreamSynchronize(s);
    if (write(out, "k", 1) != 1) break;
  }
}

static void sleep_s(double s) {
  const double end = now_s() + s;
  while (now_s() < end) {
  }
}

int main(int argc, char** argv) {
  const int trials = argc > 1 ? atoi(argv[1]) : 300;
  int to_other[2], from_other[2];
  if (pipe(to_other) || pipe(from_other)) return 1;
  const pid_t pid = fork();  // before CUDA starts: the other process gets a context of its own
  if (pid == 0) {
    close(to_other[1]);
    close(from_other[0]);
    other_process(to_other[0], from_other[1]);
    _exit(0);
  }
  close(to_other[0]);
  close(from_other[1]);
  auto other_runs = [&] {
    char c;
    return write(to_other[1], "s", 1) == 1 && read(from_other[0], &c, 1) == 1;
  };
  cudaFree(0);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  unsigned* host = nullptr;
  cuMemHostAlloc((void**)&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
  memset(host, 0, 4096);
  volatile unsigned* word = &host[0];
  volatile unsigned* flag = &host[16];
  CUdeviceptr dev;
  cuMemHostGetDevicePointer(&dev, host, 0);
  cudaEvent_t parked;
  cudaEventCreateWithFlags(&parked, cudaEventDisableTiming);
  const char* names[] = {"parked-idle", "parked-other", "launch-idle", "launch-other"};
  std::vector<double> lat[4];
  for (int t = 0; t < trials + 10; ++t) {
    for (int m = 0; m < 4; ++m) {
      *flag = 0;
      const bool parked_mode = m < 2, after_other = m % 2 == 1;
      double t0;
      spin<<<132, 128, 0, s>>>(300000);
      if (parked_mode) {
        *word = 1;
        cudaEventRecord(parked, s);
        cuStreamWaitValue32((CUstream)s, dev, 0, CU_STREAM_WAIT_VALUE_EQ);
        raise_flag<<<1, 1, 0, s>>>(flag);
        while (cudaEventQuery(parked) != cudaSuccess) {
        }
        if (after_other) {
          if (!other_runs()) return 1;
        } else {
          sleep_s(1e-3);
        }
        t0 = now_s();
        __atomic_store_n(&host[0], 0u, __ATOMIC_SEQ_CST);
      } else {
        cudaStreamSynchronize(s);
        if (after_other) {
          if (!other_runs()) return 1;
        } else {
          sleep_s(1e-3);
        }
        t0 = now_s();
        raise_flag<<<1, 1, 0, s>>>(flag);
      }
      while (*flag == 0) {
      }
      const double dt = (now_s() - t0) * 1e3;
      cudaStreamSynchronize(s);
      if (t >= 10) lat[m].push_back(dt);
    }
    usleep(200 + (t * 7919) % 800);  // the trials start at no fixed phase
  }
  if (write(to_other[1], "q", 1) != 1) kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  printf("{");
  for (int m = 0; m < 4; ++m) {
    std::vector<double>& v = lat[m];
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    printf("%s\"%s\": {\"n\": %zu, \"p10\": %.4f, \"p50\": %.4f, \"p90\": %.4f, \"p99\": %.4f}",
           m ? ", " : "", names[m], n, v[n / 10], v[n / 2], v[n * 9 / 10], v[n * 99 / 100]);
  }
  printf("}\n");
  return 0;
}
