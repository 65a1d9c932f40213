// The device plumbing of a build without CUDA: every entry point says CUDA is not built in.
#include "core/error.h"
#include "kernels/backend.h"

namespace minamp::backend {

const char* cuda_unavailable_reason() {
  return "this build of minamp has no CUDA backend (configured without nvcc or with "
         "-DMINAMP_CUDA=OFF)";
}

std::string cuda_device_name() {
  throw Error(cat("cuda device name: ", cuda_unavailable_reason()));
}

bool cuda_emulated() { return false; }

Allocator& cuda_allocator() { throw Error(cat("cuda allocator: ", cuda_unavailable_reason())); }

void cuda_copy(void*, Device, const void*, Device, size_t) {
  throw Error(cat("copy to/from cuda: ", cuda_unavailable_reason()));
}

void cuda_synchronize() {}

CudaEvent* cuda_record_event() { throw Error(cat("cuda event: ", cuda_unavailable_reason())); }
float cuda_elapsed_ms(CudaEvent*, CudaEvent*) {
  throw Error(cat("cuda event: ", cuda_unavailable_reason()));
}
void cuda_destroy_event(CudaEvent*) {}

CudaGraph* cuda_graph_capture(const std::function<void()>&) {
  throw Error(cat("cuda graph: ", cuda_unavailable_reason()));
}
void cuda_graph_launch(CudaGraph*) { throw Error(cat("cuda graph: ", cuda_unavailable_reason())); }
void cuda_graph_destroy(CudaGraph*) {}

} // namespace minamp::backend
