// CUDA kernels of the dynamic loss scaler: unscale every gradient and flag overflow in one
// multi-tensor launch, and PyTorch's _amp_update_scale_ as a one-thread kernel. Nothing here
// reads the device from the host, so a training step never waits on the scaler.
#include <algorithm>
#include <string>

#include "common.cuh"
#include "device.cuh"
#include "kernels/kernels.h"

namespace minamp::gpu {

namespace {

constexpr int kThreads = 256;

// Blocks (b, *) unscale chunk b: g *= 1 / scale[0] (the reciprocal in double, as
// GradScaler.unscale_); a non-finite unscaled g sets found_inf[0] = 1 (kernel_list.h says why the
// unscaled value) with a plain store: every writer stores the same value, so the race is benign;
// nobody resets it.
__global__ void __launch_bounds__(kThreads)
    amp_unscale_kernel(FloatChunkList list, const float* scale, float* found_inf) {
  const FloatChunk chunk = list.chunk[blockIdx.x];
  const float inv_scale = float(1.0 / double(scale[0]));
  bool saw_nonfinite = false;
  float grads[kChunkBatch];
  for_each_chunk_value(
      chunk.numel, [&](int b, int i) { grads[b] = chunk.data[i]; },
      [&](int b, int i) {
        const float unscaled = grads[b] * inv_scale;
        saw_nonfinite = saw_nonfinite || !isfinite(unscaled);
        chunk.data[i] = unscaled;
      });
  if (saw_nonfinite) found_inf[0] = 1.0f;
}

// One thread: on overflow back off and restart the count; otherwise count the good step and grow
// the scale every `interval` good steps, unless the grown scale would not be finite.
__global__ void amp_update_scale_kernel(float* scale, int32_t* growth_tracker,
                                        const float* found_inf, ScalerParams scaler) {
  if (found_inf[0] != 0.0f) {
    scale[0] *= scaler.backoff_factor;
    growth_tracker[0] = 0;
    return;
  }
  const int32_t successful = growth_tracker[0] + 1;
  if (successful == scaler.growth_interval) {
    const float grown = scale[0] * scaler.growth_factor;
    if (isfinite(grown)) scale[0] = grown;
    growth_tracker[0] = 0;
  } else {
    growth_tracker[0] = successful;
  }
}

} // namespace

void amp_unscale(const std::vector<Tensor*>& grads, const Tensor& scale, Tensor& found_inf) {
  const char* op = "amp_unscale";
  require_amp_unscale(grads, scale, found_inf);

  const float* scale_ptr = ptr<const float>(scale);
  float* found_inf_ptr = ptr<float>(found_inf);
  auto launch = [&](const FloatChunkList& list) {
    amp_unscale_kernel<<<chunk_grid(list.count), kThreads, 0, stream()>>>(list, scale_ptr,
                                                                          found_inf_ptr);
    CUDA_CHECK_LAUNCH(op);
  };
  ChunkBatcher<FloatChunkList, decltype(launch)> batcher(launch);
  for (const Tensor* grad : grads) push_float_chunks(batcher, *grad);
  batcher.flush();
}

void amp_update_scale(Tensor& scale, Tensor& growth_tracker, const Tensor& found_inf,
                      const ScalerParams& scaler) {
  const char* op = "amp_update_scale";
  require_amp_update_scale(scale, growth_tracker, found_inf);
  amp_update_scale_kernel<<<1, 1, 0, stream()>>>(ptr<float>(scale), ptr<int32_t>(growth_tracker),
                                                 ptr<const float>(found_inf), scaler);
  CUDA_CHECK_LAUNCH(op);
}

} // namespace minamp::gpu
