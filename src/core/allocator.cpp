// The byte-counting allocator base and the CPU allocator (64-byte aligned, for vector units).
#include "core/allocator.h"

#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"
#include "kernels/backend.h"

namespace minamp {

void* Allocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (limit_ != 0 && bytes > limit_ - std::min(live_, limit_))
    throw OutOfMemory(cat(device_name(), " allocator: out of memory allocating ", bytes, " bytes: ",
                          live_, " bytes are live and the memory limit is ", limit_, " bytes"));
  void* ptr = raw_allocate(bytes);
  live_ += bytes;
  if (live_ > peak_) peak_ = live_;
  return ptr;
}

void Allocator::deallocate(void* ptr, size_t bytes) {
  if (!ptr) return;
  raw_deallocate(ptr, bytes);
  live_ -= bytes;
}

namespace {
class CpuAllocator final : public Allocator {
public:
  CpuAllocator() {
    // glibc maps every block above 128 KiB afresh and unmaps it on free, so each training step
    // would page-fault its activations in again. Keeping large blocks in the heap lets the
    // next step reuse them (peak accounting above is unaffected).
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }

private:
  const char* device_name() const override { return "cpu"; }
  void* raw_allocate(size_t bytes) override {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* ptr = std::aligned_alloc(64, rounded);
    if (!ptr) throw OutOfMemory(cat("cpu allocator: out of memory allocating ", bytes, " bytes"));
    return ptr;
  }
  void raw_deallocate(void* ptr, size_t) override { std::free(ptr); }
};
} // namespace

Allocator& allocator_for(Device device) {
  // Never destroyed, like the CUDA one: a tensor with static storage may be freed at exit.
  static CpuAllocator& cpu = *new CpuAllocator;
  if (device == Device::cpu) return cpu;
  return backend::cuda_allocator();
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::cpu && src_device == Device::cpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
  backend::cuda_copy(dst, dst_device, src, src_device, bytes);
}

bool cuda_available() { return backend::cuda_unavailable_reason() == nullptr; }

const char* cuda_unavailable_reason() {
  const char* reason = backend::cuda_unavailable_reason();
  return reason ? reason : "";
}

std::string device_description(Device device) {
  return device == Device::cpu ? std::string("cpu") : backend::cuda_device_name();
}

bool cuda_emulated() { return backend::cuda_emulated(); }

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::cpu;
  if (name == "cuda") return Device::cuda;
  throw Error(cat("device: expected 'cpu' or 'cuda', got '", name, "'"));
}

} // namespace minamp
