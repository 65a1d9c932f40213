// CUDA optimizer steps as fused multi-tensor kernels: SGD (momentum, L2 weight decay) and Adam
// (bias-corrected, L2 weight decay), in fp32 on the master weights, rewriting the f16 copy in the
// same pass; and zero_grad's zeroing of every gradient in one launch. Every thread reads
// found_inf[0] on the device and does nothing when it is set, so a skipped step costs no
// host-device synchronisation.
#include <algorithm>

#include "common.cuh"
#include "device.cuh"
#include "kernels/kernels.h"

namespace minamp::gpu {

namespace {

constexpr int kThreads = 256;

// Up to kChunkElements consecutive values of one parameter and of its companions. half and the
// states are nullptr when the step does not use them.
struct ParamChunk {
  float* master;
  const float* grad;
  __half* half;
  float* state0; // SGD momentum buffer / Adam exp_avg
  float* state1; // Adam exp_avg_sq
  int numel;
};
// 80 chunks of 48 bytes: 3.8 KB of kernel parameters, 2.6 M parameter values per launch.
using ParamChunkList = ChunkList<ParamChunk, 80>;

__device__ __forceinline__ bool step_skipped(const float* found_inf) {
  return found_inf && found_inf[0] != 0.0f;
}

// Block b zeroes chunk b.
__global__ void __launch_bounds__(kThreads) zero_kernel(FloatChunkList list) {
  const FloatChunk c = list.chunk[blockIdx.x];
  for (int i = threadIdx.x; i < c.numel; i += blockDim.x) c.data[i] = 0.0f;
}

// Block b updates chunk b (PyTorch SGD, dampening 0; the momentum buffer starts at zero, so the
// first step's buffer is the gradient).
__global__ void __launch_bounds__(kThreads)
    sgd_kernel(ParamChunkList list, SgdParams sgd, const float* found_inf) {
  if (step_skipped(found_inf)) return;
  const ParamChunk c = list.chunk[blockIdx.x];
  for (int i = threadIdx.x; i < c.numel; i += blockDim.x) {
    float w = c.master[i];
    const float d = c.grad[i] + sgd.weight_decay * w;
    if (c.state0) {
      const float buf = sgd.momentum * c.state0[i] + d;
      c.state0[i] = buf;
      w -= sgd.lr * buf;
    } else {
      w -= sgd.lr * d;
    }
    c.master[i] = w;
    if (c.half) c.half[i] = __float2half_rn(w);
  }
}

// Block b updates chunk b (PyTorch Adam with L2 weight decay, not AdamW). t = step[0] + 1: the
// step counter is incremented by a later launch, after every chunk has read it.
__global__ void __launch_bounds__(kThreads)
    adam_kernel(ParamChunkList list, AdamParams adam, const float* step, const float* found_inf) {
  if (step_skipped(found_inf)) return;
  const ParamChunk c = list.chunk[blockIdx.x];
  const float t = step[0] + 1.0f;
  // In double, as on the CPU (kernels/cpu/optim.cpp): the same two floats on both backends.
  const float bias_correction1 = float(1.0 - pow(double(adam.beta1), double(t)));
  const float bias_correction2 = float(1.0 - pow(double(adam.beta2), double(t)));
  for (int i = threadIdx.x; i < c.numel; i += blockDim.x) {
    float w = c.master[i];
    const float d = c.grad[i] + adam.weight_decay * w;
    const float m = adam.beta1 * c.state0[i] + (1.0f - adam.beta1) * d;
    const float v = adam.beta2 * c.state1[i] + (1.0f - adam.beta2) * d * d;
    c.state0[i] = m;
    c.state1[i] = v;
    w -= adam.lr * (m / bias_correction1) / (sqrtf(v / bias_correction2) + adam.eps);
    c.master[i] = w;
    if (c.half) c.half[i] = __float2half_rn(w);
  }
}

__global__ void increment_step_kernel(float* step, const float* found_inf) {
  if (!step_skipped(found_inf)) step[0] += 1.0f;
}

// found_inf's device pointer, or nullptr when it is undefined (the step is never skipped).
const float* found_inf_ptr(const char* op, const Tensor& found_inf) {
  if (!found_inf.defined()) return nullptr;
  require_f32(op, "found_inf", found_inf, 1);
  return ptr<const float>(found_inf);
}

// Splits every parameter into chunks and calls launch(list) for each full list and the rest.
// `states` is how many state tensors the step uses (0, 1 or 2).
template <class Launch>
void for_each_chunk_list(const std::vector<ParamSlot>& params, int states, Launch launch) {
  ChunkBatcher<ParamChunkList, Launch> batcher(launch);
  for (const ParamSlot& slot : params) {
    const bool has_half = slot.half && slot.half->defined();
    const int64_t n = slot.master->numel();
    for (int64_t offset = 0; offset < n; offset += kChunkElements) {
      ParamChunk c;
      c.master = ptr<float>(*slot.master) + offset;
      c.grad = ptr<const float>(*slot.grad) + offset;
      c.half = has_half ? half_ptr(*slot.half) + offset : nullptr;
      c.state0 = states > 0 ? ptr<float>(*slot.state0) + offset : nullptr;
      c.state1 = states > 1 ? ptr<float>(*slot.state1) + offset : nullptr;
      c.numel = int(std::min(kChunkElements, n - offset));
      batcher.push(c);
    }
  }
  batcher.flush();
}

} // namespace

void zero_grads(const std::vector<Tensor*>& grads) {
  for (const Tensor* grad : grads)
    require(grad && grad->defined() && grad->dtype() == DType::f32, "zero_grads",
            "gradients must be defined f32 tensors, got ", describe(grad));
  auto launch = [](const FloatChunkList& list) {
    zero_kernel<<<list.count, kThreads, 0, stream()>>>(list);
    CUDA_CHECK_LAUNCH("zero_grads");
  };
  ChunkBatcher<FloatChunkList, decltype(launch)> batcher(launch);
  for (const Tensor* grad : grads) push_float_chunks(batcher, *grad);
  batcher.flush();
}

void sgd_step(const std::vector<ParamSlot>& params, const SgdParams& sgd, const Tensor& found_inf) {
  const char* op = "sgd_step";
  const int states = sgd.momentum != 0.0f ? 1 : 0;
  for (const ParamSlot& slot : params) require_param_slot(op, slot, states);
  const float* skip = found_inf_ptr(op, found_inf);
  for_each_chunk_list(params, states, [&](const ParamChunkList& list) {
    sgd_kernel<<<list.count, kThreads, 0, stream()>>>(list, sgd, skip);
    CUDA_CHECK_LAUNCH(op);
  });
}

void adam_step(const std::vector<ParamSlot>& params, const AdamParams& adam, Tensor& step,
               const Tensor& found_inf) {
  const char* op = "adam_step";
  require_f32(op, "step", step, 1);
  for (const ParamSlot& slot : params) require_param_slot(op, slot, 2);
  const float* skip = found_inf_ptr(op, found_inf);
  for_each_chunk_list(params, 2, [&](const ParamChunkList& list) {
    adam_kernel<<<list.count, kThreads, 0, stream()>>>(list, adam, ptr<const float>(step), skip);
    CUDA_CHECK_LAUNCH(op);
  });
  increment_step_kernel<<<1, 1, 0, stream()>>>(ptr<float>(step), skip);
  CUDA_CHECK_LAUNCH(op);
}

} // namespace minamp::gpu
