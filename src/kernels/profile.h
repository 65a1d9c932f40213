// The op profiler: while enabled, every kernel call made through the kernels:: dispatcher is
// timed — on the CPU with a steady clock, on the GPU with CUDA events queued around the call
// (no host wait while recording) — and collect() returns the total per op and device. Ops called
// from inside another op's kernel are part of the outer op's time. bench_train --profile uses it
// to show where a training step's time goes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace minamp::backend {
struct CudaEvent;
}

namespace minamp::profile {

// The time of one op on one device since profiling was enabled or last collected.
struct OpTime {
  std::string op;
  Device device = Device::cpu;
  int64_t calls = 0;
  double ms = 0.0;
};

// Turns recording on or off (off at start). Turning it off keeps what was recorded.
void set_enabled(bool enabled);
bool enabled();

// The recorded totals, slowest first, then forgets them. Waits for the GPU to pass the last
// recorded call.
std::vector<OpTime> collect();

// The table of `times` recorded over `steps` steps: per op, its device, calls and milliseconds
// per step and share of the time inside ops, slowest first; each line starts with `indent`.
std::string format_table(const std::vector<OpTime>& times, int64_t steps,
                         const std::string& indent);

// Times the current call while profiling is enabled and no other Scope is open on this thread.
class Scope {
public:
  Scope(const char* op, Device device);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

private:
  const char* op_ = nullptr; // nullptr: this scope records nothing
  Device device_ = Device::cpu;
  double cpu_start_ms_ = 0.0;
  backend::CudaEvent* gpu_start_ = nullptr;
};

} // namespace minamp::profile
