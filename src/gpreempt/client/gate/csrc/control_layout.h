// The control block's layout, for the C++ gates. The one definition is the table in
// gpreempt/control.py; tests/test_control_layout.py checks every constant here against it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpreempt_layout {

constexpr size_t kSize = 144;

constexpr size_t kOffGateClosed = 0;        // u32, daemon
constexpr size_t kOffGeneration = 4;        // u32, daemon
constexpr size_t kOffRequests = 8;          // u32, client
constexpr size_t kOffAutoActive = 12;       // u32, client
constexpr size_t kOffLaunches = 16;         // u64, client
constexpr size_t kOffWaits = 24;            // u64, client
constexpr size_t kOffWaitNs = 32;           // u64, client
constexpr size_t kOffWindow = 40;           // u32, client
constexpr size_t kOffInstalled = 44;        // u32, client
constexpr size_t kOffHinted = 48;           // u32, client
constexpr size_t kOffWindowShareUs = 52;    // u32, daemon
constexpr size_t kOffSleepOk = 56;          // u32, daemon
constexpr size_t kOffBarriersOn = 60;       // u32, client
constexpr size_t kOffDriverGate = 64;       // u32, client (driver-level gate state)
constexpr size_t kOffDriverAsleep = 68;     // u32, client
constexpr size_t kOffDriverLaunches = 72;   // u64, client
constexpr size_t kOffDriverWaits = 80;      // u64, client
constexpr size_t kOffDriverWaitNs = 88;     // u64, client
constexpr size_t kOffDriverBarriers = 96;   // u64, client
constexpr size_t kOffDriverStreams = 104;   // u32, client
constexpr size_t kOffActivityEpoch = 108;   // u32, client (bumped when activity rises)
constexpr size_t kOffBarrierLeaks = 112;    // u32, client (driver-level gate)
constexpr size_t kOffDriverNsPerLaunch = 116;  // u32, client (driver-level gate, statistics)
constexpr size_t kOffDriverBoundWaits = 120;   // u32, client (driver-level gate, statistics)
constexpr size_t kOffMarker = 124;          // u32, client (what marks its requests)
constexpr size_t kOffDevices = 128;         // u64, client (bit N: a context on GPU N)
constexpr size_t kOffQuiet = 136;           // u32, daemon (raises may leave the doorbell)
constexpr size_t kOffBarriersChecked = 140;  // u32, client (driver-level gate, statistics)

// gate_closed of a plain closed gate (odd); 2V: closed only while watch list V is active.
constexpr uint32_t kClosed = 1;

// driver_gate: what the driver-level gate of the process is doing.
constexpr uint32_t kDriverNone = 0;         // not loaded (yet)
constexpr uint32_t kDriverOn = 1;           // sees and holds every launch
constexpr uint32_t kDriverUnavailable = 2;  // CUPTI's subscriber is taken (a profiler or tool)
constexpr uint32_t kDriverReleased = 3;     // handed to a profiler started in the process
constexpr uint32_t kDriverFailed = 4;       // CUPTI could not be set up, or a barrier failed

}  // namespace gpreempt_layout
