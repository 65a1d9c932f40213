// The CUDA backend's device plumbing as seen from host code: allocator, copies, availability.
// Implemented in cuda/device.cu when the build has CUDA, and in src/kernels/no_cuda.cpp when not.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "core/allocator.h"

namespace minamp::backend {

// nullptr when a CUDA device can be used; otherwise a sentence saying why not.
const char* cuda_unavailable_reason();
// The CUDA device's name (e.g. "NVIDIA H100 80GB HBM3"); throws when there is none.
std::string cuda_device_name();
// True when the CUDA backend runs on the CPU emulator of cuda/emulator (the *_emulated programs).
bool cuda_emulated();
Allocator& cuda_allocator();
void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// Waits for all queued GPU work (a no-op without CUDA).
void cuda_synchronize();

// Timing GPU work (the op profiler): an event recorded on the stream marks the point the GPU
// has reached when it completes. cuda_elapsed_ms waits for `end` and returns the milliseconds
// from `begin` to `end`; every recorded event must be destroyed once.
struct CudaEvent;
CudaEvent* cuda_record_event();
float cuda_elapsed_ms(CudaEvent* begin, CudaEvent* end);
void cuda_destroy_event(CudaEvent* event);

// CUDA graphs: cuda_graph_capture runs `work` with the stream capturing instead of executing —
// no GPU work runs, kernels and copies are recorded — and returns the instantiated graph, which
// cuda_graph_launch replays with one launch (the same kernels on the same addresses). `work` must
// not wait for the GPU or copy to or from the host. The blocks allocated or freed while capturing
// stay reserved for the graph until cuda_graph_destroy; one graph exists at a time. A replay
// repeats only GPU work: what `work` did on the host happened once, at capture — kernel arguments
// (a learning rate set later is not seen), host counters (BatchNorm's num_batches_tracked counts
// the capture as one step, not the replays), and, when a capture fails, the host state it left
// (e.g. a GradScaler that believes the optimizer stepped). Tensors the graph reads must not be
// reassigned or moved (Parameter::to, loading a checkpoint) while it exists.
struct CudaGraph;
CudaGraph* cuda_graph_capture(const std::function<void()>& work);
void cuda_graph_launch(CudaGraph* graph);
void cuda_graph_destroy(CudaGraph* graph);

} // namespace minamp::backend
