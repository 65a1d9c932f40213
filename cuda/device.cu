// The CUDA backend's device plumbing: checked calls, the one stream, launch sizes, device
// availability, the caching allocator and copies (backend.h, common.cuh, device.cuh).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common.cuh"
#include "device.cuh"
#include "kernels/backend.h"
#include "kernels/profile.h"

namespace minamp::gpu {

void check_cuda(cudaError_t status, const char* what, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw Error(cat(what, ": CUDA error ", cudaGetErrorName(status), " (", cudaGetErrorString(status),
                  ") at ", file, ":", line));
}

// One stream for every kernel and copy, created on first use and never destroyed (it lives as
// long as the process, so no static-destruction order can outlive it). One stream keeps the
// model simple: all GPU work is ordered, so a freed block can be handed to the next allocation
// without events, and a whole step can be captured into a CUDA graph (which the legacy default
// stream does not allow). It is non-blocking so that stray work on the default stream from other
// libraries does not serialise with it.
cudaStream_t stream() {
  static cudaStream_t the_stream = [] {
    cudaStream_t s = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating the minamp stream");
    return s;
  }();
  return the_stream;
}

int sm_count() {
  static const int count = [] {
    int device = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&device), "cudaGetDevice");
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
               "reading the SM count");
    return sms;
  }();
  return count;
}

int compute_capability() {
  static const int capability = [] {
    int device = 0, major = 0, minor = 0;
    CUDA_CHECK(cudaGetDevice(&device), "cudaGetDevice");
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
               "reading the compute capability");
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
               "reading the compute capability");
    return major * 10 + minor;
  }();
  return capability;
}

// Kernels use grid-stride loops, so the grid only needs to fill the device a few times over:
// 4 waves of 2048 resident threads per SM. Never 0 blocks, so an empty tensor still launches a
// valid (idle) grid and reductions still write their outputs.
int grid_for(int64_t n, int threads) {
  const int64_t max_blocks = int64_t(sm_count()) * 4 * (2048 / threads);
  const int64_t wanted = (n + threads - 1) / threads;
  return static_cast<int>(std::max<int64_t>(1, std::min(wanted, max_blocks)));
}

namespace {

size_t g_malloc_calls = 0;

// Freed blocks are cached by size class so that a training step, which allocates the same sizes
// every iteration, reuses them and never calls cudaMalloc (or the synchronising cudaFree) after
// the first step. A request is rounded up to its size class: a multiple of 512 bytes below
// 1 MiB, a multiple of 1 MiB above. A cached block is handed only to a request of exactly its
// class (no splitting), which wastes at most 1 MiB per large block and keeps the code short.
// Reuse is safe without events because all work runs on the one stream, in order: a kernel
// queued after the new owner got the block runs after every kernel of the old owner.
// Single-threaded, like the rest of minamp.
//
// With MINAMP_CUDA_EXACT_ALLOC=1 in the environment (a debugging mode, used by
// scripts/gpu-check.sh under compute-sanitizer memcheck and by `make test-sanitize`), a request
// gets a block of exactly its size and a freed block goes straight back to cudaFree, so that a
// kernel reading or writing past a tensor's end, or into a freed tensor, touches memory that is
// no allocation's and the sanitizer reports it (rounded, cached blocks would hide both). Capture
// still keeps its private pool (cudaFree is not allowed while capturing).
//
// CUDA graph capture (backend::cuda_graph_capture) bakes the addresses of the blocks a step uses
// into the graph, so while a graph exists none of them may go to another owner: during capture
// every request is served from a pool private to the graph and every freed block (whoever had
// it) joins that pool, and a private block freed after capture returns to the pool too. Nothing
// outside the capture takes blocks from it; destroying the graph hands the pool to the shared
// cache. (The pool is not given back on out-of-memory: a graph's blocks are in use.)
class CudaCachingAllocator final : public Allocator {
public:
  void begin_capture() { capturing_ = true; }
  void end_capture() { capturing_ = false; }
  void release_private_pool() {
    for (auto& entry : private_free_)
      for (void* block : entry.second) free_blocks_[entry.first].push_back(block);
    private_free_.clear();
    private_blocks_.clear();
  }

private:
  const char* device_name() const override { return "cuda"; }
  static size_t size_class(size_t bytes) {
    if (cuda_exact_allocation()) return bytes;
    constexpr size_t kSmallGranule = 512, kLargeGranule = size_t(1) << 20;
    const size_t granule = bytes < kLargeGranule ? kSmallGranule : kLargeGranule;
    return (bytes + granule - 1) / granule * granule;
  }

  void* raw_allocate(size_t bytes) override {
    const char* reason = backend::cuda_unavailable_reason();
    if (reason) throw Error(cat("cuda allocator: cannot allocate ", bytes, " bytes: ", reason));
    const size_t size = size_class(bytes);
    if (capturing_) return private_allocate(size);
    std::vector<void*>& blocks = free_blocks_[size];
    if (!blocks.empty()) {
      void* block = blocks.back();
      blocks.pop_back();
      return block;
    }
    void* block = device_malloc(size);
    if (block) return block;
    release_cache(); // give every cached block back to the driver and try once more
    block = device_malloc(size);
    if (block) return block;
    throw OutOfMemory(cat("cuda allocator: out of memory allocating ", bytes, " bytes (size class ",
                          size, "); minamp has ", live_bytes(), " bytes live, peak ", peak_bytes(),
                          " bytes"));
  }

  void raw_deallocate(void* ptr, size_t bytes) override {
    if (capturing_ || private_blocks_.count(ptr)) {
      private_blocks_.insert(ptr);
      private_free_[size_class(bytes)].push_back(ptr);
      return;
    }
    if (cuda_exact_allocation())
      free_block(ptr);
    else
      free_blocks_[size_class(bytes)].push_back(ptr);
  }

  // A block of the private pool, or a new one that joins it (no shared block: it may be in use
  // by tensors that outlive the capture).
  void* private_allocate(size_t size) {
    std::vector<void*>& blocks = private_free_[size];
    void* block = nullptr;
    if (!blocks.empty()) {
      block = blocks.back();
      blocks.pop_back();
      return block;
    }
    block = device_malloc(size);
    if (!block)
      throw OutOfMemory(cat("cuda allocator: out of memory allocating ", size,
                            " bytes for a CUDA graph capture; minamp has ", live_bytes(),
                            " bytes live"));
    private_blocks_.insert(block);
    return block;
  }

  // Gives every cached block back to the driver, after the stream has finished with them.
  void release_cache() {
    CUDA_CHECK(cudaStreamSynchronize(gpu::stream()), "cuda allocator: synchronize");
    for (auto& entry : free_blocks_)
      for (void* block : entry.second) free_block(block);
    free_blocks_.clear();
  }

  // cudaFree (which waits for the device). After main returns the runtime may be unloaded
  // already; a block freed then is left to the driver's own clean-up.
  static void free_block(void* block) {
    const cudaError_t status = cudaFree(block);
    if (status != cudaErrorCudartUnloading) CUDA_CHECK(status, "cuda allocator: cudaFree");
  }

  // cudaMalloc, or nullptr when the device is out of memory (other errors throw).
  static void* device_malloc(size_t size) {
    ++g_malloc_calls;
    void* block = nullptr;
    const cudaError_t status = cudaMalloc(&block, size);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError(); // clear the (non-sticky) error so later checks do not see it
      return nullptr;
    }
    CUDA_CHECK(status, cat("cuda allocator: cudaMalloc of ", size, " bytes").c_str());
    return block;
  }

  std::unordered_map<size_t, std::vector<void*>> free_blocks_; // size class -> cached blocks
  bool capturing_ = false;
  std::unordered_map<size_t, std::vector<void*>> private_free_; // the graph's free blocks
  std::unordered_set<void*> private_blocks_;                    // every block of the graph's pool
};

} // namespace

size_t cuda_malloc_calls() { return g_malloc_calls; }

bool cuda_exact_allocation() {
  static const bool exact = [] {
    const char* value = std::getenv("MINAMP_CUDA_EXACT_ALLOC");
    return value && *value && std::strcmp(value, "0") != 0;
  }();
  return exact;
}

} // namespace minamp::gpu

namespace minamp::backend {

// Asked once; the answer cannot change while the process runs.
const char* cuda_unavailable_reason() {
  static const std::string reason = [] {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      return cat("no CUDA device can be used (cudaGetDeviceCount: ", cudaGetErrorName(status), ", ",
                 cudaGetErrorString(status), ")");
    }
    if (count == 0) return std::string("no CUDA device was found (cudaGetDeviceCount: 0)");
    return std::string();
  }();
  return reason.empty() ? nullptr : reason.c_str();
}

std::string cuda_device_name() {
  int device = 0;
  cudaDeviceProp properties{};
  CUDA_CHECK(cudaGetDevice(&device), "cudaGetDevice");
  CUDA_CHECK(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  return properties.name;
}

bool cuda_emulated() {
#ifdef MINAMP_CUDA_EMULATOR
  return true;
#else
  return false;
#endif
}

// Never destroyed: tensors with static storage duration may free memory during exit, after
// function-local statics would already be gone. It exists even without a device (its
// allocate() then throws the reason), so that Tensor's storage destructor can always reach it.
gpu::CudaCachingAllocator& caching_allocator() {
  static auto* allocator = new gpu::CudaCachingAllocator();
  return *allocator;
}

Allocator& cuda_allocator() { return caching_allocator(); }

namespace {

// Host-to-device copies that do not wait for the GPU (a training loop uploading a batch per step
// would otherwise drain the stream every step): the bytes are copied into one of kSlots pinned
// staging buffers, whose copy to the device is queued on the stream. A slot is reused kSlots
// uploads later, after waiting for its previous copy — by then long done. Never destroyed, like
// the allocator. Single-threaded, like the rest of minamp.
class UploadRing {
public:
  // False (nothing copied) when no pinned buffer of `bytes` can be had.
  bool upload(void* dst, const void* src, size_t bytes) {
    Slot& slot = slots_[next_];
    next_ = (next_ + 1) % kSlots;
    if (slot.copied)
      CUDA_CHECK(cudaEventSynchronize(slot.copied), "copy to cuda: waiting for a staging buffer");
    else
      CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming),
                 "copy to cuda: creating an event");
    if (slot.capacity < bytes) {
      if (slot.buffer) CUDA_CHECK(cudaFreeHost(slot.buffer), "copy to cuda: cudaFreeHost");
      slot.buffer = nullptr;
      slot.capacity = 0;
      const size_t capacity = (bytes + kGranule - 1) / kGranule * kGranule; // grows rarely
      if (cudaMallocHost(&slot.buffer, capacity) != cudaSuccess) {
        (void)cudaGetLastError();
        slot.buffer = nullptr;
        return false;
      }
      slot.capacity = capacity;
    }
    std::memcpy(slot.buffer, src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, slot.buffer, bytes, cudaMemcpyHostToDevice, gpu::stream()),
               "copy to cuda");
    CUDA_CHECK(cudaEventRecord(slot.copied, gpu::stream()), "copy to cuda: recording an event");
    return true;
  }

private:
  struct Slot {
    void* buffer = nullptr; // pinned
    size_t capacity = 0;
    cudaEvent_t copied = nullptr; // recorded after the slot's last copy
  };
  static constexpr int kSlots = 4;
  static constexpr size_t kGranule = size_t(1) << 20;
  Slot slots_[kSlots];
  int next_ = 0;
};

UploadRing& upload_ring() {
  static auto* ring = new UploadRing();
  return *ring;
}

// Larger uploads (whole data sets) go straight from pageable memory and wait, rather than pin
// that much host memory for good.
constexpr size_t kMaxStagedBytes = size_t(64) << 20;

} // namespace

// Copies on the one stream. A host-to-device copy of up to kMaxStagedBytes is staged
// (UploadRing) and only queued; any other copy that involves host memory (or an upload for which
// no pinned buffer can be had) waits for the copy. A
// device-to-device copy is only queued. In every case the caller may reuse or free a host
// buffer at once, and the copy is just as synchronous for every observer of device memory, since
// all later GPU work runs after it in order.
void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  const char* reason = cuda_unavailable_reason();
  if (reason) throw Error(cat("copy to/from cuda: ", reason));
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(gpu::stream(), &capture), "copy to/from cuda");
  const bool host_involved = dst_device == Device::cpu || src_device == Device::cpu;
  if (host_involved && capture != cudaStreamCaptureStatusNone)
    throw Error("copy to/from cuda: a copy from or to host memory cannot be captured in a CUDA "
                "graph");
  if (dst_device == Device::cuda && src_device == Device::cpu && bytes <= kMaxStagedBytes &&
      upload_ring().upload(dst, src, bytes))
    return;
  const cudaMemcpyKind kind =
      dst_device == Device::cpu
          ? (src_device == Device::cpu ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost)
          : (src_device == Device::cpu ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, gpu::stream()), "cuda_copy");
  if (host_involved) CUDA_CHECK(cudaStreamSynchronize(gpu::stream()), "cuda_copy: synchronize");
}

void cuda_synchronize() {
  if (cuda_unavailable_reason()) return;
  CUDA_CHECK(cudaStreamSynchronize(gpu::stream()), "cuda_synchronize");
}

struct CudaEvent {
  cudaEvent_t event = nullptr;
};

CudaEvent* cuda_record_event() {
  const char* reason = cuda_unavailable_reason();
  if (reason) throw Error(cat("cuda event: ", reason));
  auto* recorded = new CudaEvent;
  const cudaError_t created = cudaEventCreate(&recorded->event);
  const cudaError_t status =
      created == cudaSuccess ? cudaEventRecord(recorded->event, gpu::stream()) : created;
  if (status != cudaSuccess) cuda_destroy_event(recorded);
  CUDA_CHECK(status, "cuda event: create and record");
  return recorded;
}

float cuda_elapsed_ms(CudaEvent* begin, CudaEvent* end) {
  CUDA_CHECK(cudaEventSynchronize(end->event), "cuda event: wait");
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, begin->event, end->event), "cuda event: elapsed time");
  return ms;
}

void cuda_destroy_event(CudaEvent* event) {
  if (event && event->event) (void)cudaEventDestroy(event->event);
  delete event;
}

struct CudaGraph {
  cudaGraphExec_t exec = nullptr;
};

namespace {
bool g_graph_exists = false; // one graph at a time: the allocator has one private pool
}

// Relaxed capture mode: the allocator may call cudaMalloc while a capture is open. A failure
// inside `work` (an error, or a call that is illegal while capturing, such as a host copy) ends
// the capture, discards it and rethrows, so the stream is never left capturing.
CudaGraph* cuda_graph_capture(const std::function<void()>& work) {
  const char* reason = cuda_unavailable_reason();
  if (reason) throw Error(cat("cuda graph: ", reason));
  if (g_graph_exists) throw Error("cuda graph: one graph at a time; destroy the other one first");
  gpu::CudaCachingAllocator& allocator = caching_allocator();
  // The op profiler's events cannot be read back from a capture: it pauses meanwhile.
  const bool profiling = profile::enabled();
  profile::set_enabled(false);
  struct ResumeProfiling {
    bool on;
    ~ResumeProfiling() { profile::set_enabled(on); }
  } resume{profiling};
  CUDA_CHECK(cudaStreamBeginCapture(gpu::stream(), cudaStreamCaptureModeRelaxed),
             "cuda graph: begin capture");
  allocator.begin_capture();
  g_graph_exists = true;
  cudaGraph_t graph = nullptr;
  try {
    work();
  } catch (...) {
    (void)cudaStreamEndCapture(gpu::stream(), &graph);
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    allocator.end_capture();
    allocator.release_private_pool();
    g_graph_exists = false;
    throw;
  }
  allocator.end_capture();
  const cudaError_t ended = cudaStreamEndCapture(gpu::stream(), &graph);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated =
      ended == cudaSuccess ? cudaGraphInstantiate(&exec, graph, 0) : ended;
  if (graph) (void)cudaGraphDestroy(graph);
  if (instantiated != cudaSuccess) {
    (void)cudaGetLastError(); // so that the next launch check does not report this error again
    allocator.release_private_pool();
    g_graph_exists = false;
  }
  CUDA_CHECK(instantiated, "cuda graph: end capture and instantiate");
  return new CudaGraph{exec};
}

void cuda_graph_launch(CudaGraph* graph) {
  CUDA_CHECK(cudaGraphLaunch(graph->exec, gpu::stream()), "cuda graph: launch");
}

void cuda_graph_destroy(CudaGraph* graph) {
  if (!graph) return;
  (void)cudaGraphExecDestroy(graph->exec);
  delete graph;
  caching_allocator().release_private_pool();
  g_graph_exists = false;
}

} // namespace minamp::backend
