// Allocators: every tensor's memory comes from the allocator of its device, which counts live
// and peak bytes so that examples and benchmarks can report peak memory, and can cap the live
// bytes (a smaller device, replayed on a bigger one or on the CPU).
#pragma once

#include <cstddef>
#include <string>

#include "core/dtype.h"

namespace minamp {

class Allocator {
public:
  virtual ~Allocator() = default;
  void* allocate(size_t bytes);
  void deallocate(void* ptr, size_t bytes);

  size_t live_bytes() const { return live_; }
  size_t peak_bytes() const { return peak_; }
  // Starts a new peak measurement from the bytes live now.
  void reset_peak() { peak_ = live_; }

  // Caps the bytes of live tensors (0: no cap, the default). A request that would take the live
  // bytes past the cap throws OutOfMemory naming the request and the cap, as the device would
  // when its memory ran out.
  void set_memory_limit(size_t bytes) { limit_ = bytes; }
  size_t memory_limit() const { return limit_; }

protected:
  // "cpu" or "cuda", for messages.
  virtual const char* device_name() const = 0;
  virtual void* raw_allocate(size_t bytes) = 0;
  virtual void raw_deallocate(void* ptr, size_t bytes) = 0;

private:
  size_t live_ = 0;
  size_t peak_ = 0;
  size_t limit_ = 0;
};

// The allocator for a device; for Device::cuda this throws Error when CUDA is unavailable.
Allocator& allocator_for(Device device);

// Copies `bytes` between any two devices. The source may be reused or freed as soon as it
// returns, and every later read of the destination sees the copy: a copy to the host has
// finished; a copy to a GPU is ordered before all later GPU work (it may still be queued).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

// True when this build has the CUDA backend and a CUDA device is present.
bool cuda_available();
// Why cuda_available() is false (empty when it is true).
const char* cuda_unavailable_reason();
// Where Device::cuda runs: "cpu" for Device::cpu; for Device::cuda the GPU's name, e.g.
// "NVIDIA H100 80GB HBM3", or the CUDA emulator's (throws Error when CUDA is unavailable).
std::string device_description(Device device);
// True when Device::cuda is the CPU emulator of cuda/emulator (the *_emulated programs).
bool cuda_emulated();

} // namespace minamp
