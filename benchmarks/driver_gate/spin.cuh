// What barrier_cost.cu and parked_channel.cu share: a kernel that keeps its blocks busy for a
// given time on the GPU's own clock, and the host's clock in seconds.
#pragma once
#include <chrono>

__global__ void spin(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

static double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
