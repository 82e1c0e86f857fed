// Which physical GPU a CUDA device ordinal of this process is, read as gpreempt's ranks read it
// (gpreempt/client/ranks.py): the ordinal-th entry of CUDA_VISIBLE_DEVICES where that is a
// plain index, the ordinal itself where the variable is unset. No CUDA call: the rule is tested
// on the CPU (tests/test_visible_devices.py).
#pragma once

#include <cstring>

namespace gpreempt_devices {

// The physical index of device `ordinal` given CUDA_VISIBLE_DEVICES' value `visible` (null:
// unset), or -1 where it cannot be told (a UUID or MIG entry, too few entries, an index past
// `limit`).
inline int physical_gpu(int ordinal, const char* visible, int limit = 63) {
  if (ordinal < 0) {
    return -1;
  }
  if (visible == nullptr) {
    return ordinal <= limit ? ordinal : -1;
  }
  const char* entry = visible;
  for (int i = 0; i < ordinal; ++i) {
    entry = std::strchr(entry, ',');
    if (entry == nullptr) {
      return -1;
    }
    ++entry;
  }
  while (*entry == ' ') {
    ++entry;
  }
  int value = 0;
  int digits = 0;
  for (; *entry >= '0' && *entry <= '9'; ++entry, ++digits) {
    value = value * 10 + (*entry - '0');
    if (value > limit) {
      return -1;
    }
  }
  while (*entry == ' ') {
    ++entry;
  }
  return digits > 0 && (*entry == ',' || *entry == '\0') ? value : -1;
}

}  // namespace gpreempt_devices
