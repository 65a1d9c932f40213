// CUDA optimizer steps as fused multi-tensor kernels: SGD (momentum, L2 weight decay) and Adam
// (bias-corrected, L2 weight decay), in fp32 on the master weights, rewriting the f16 or bf16
// working copy in the same pass (store_master); and zero_grad's zeroing of every gradient in one
// launch. Every thread reads found_inf[0] on the device and does nothing when it is set, so a
// skipped step costs no host-device synchronisation.
#include <algorithm>

#include "common.cuh"
#include "device.cuh"
#include "kernels/kernels.h"

namespace minamp::gpu {

namespace {

constexpr int kThreads = 256;

// Up to kChunkElements consecutive values of one parameter: its fp32 master and gradient and its
// 16-bit working copy (nullptr when it has none; bf16 when `half_is_bf16`, else f16).
struct ParamValues {
  float* master;
  const float* grad;
  void* half;
  int numel;
  bool half_is_bf16;
};
// The same values with the state each step reads at that offset, named as torch.optim names it.
struct SgdChunk {
  ParamValues param;
  float* momentum_buffer; // nullptr without momentum
};
struct AdamChunk {
  ParamValues param;
  float* exp_avg;
  float* exp_avg_sq;
};
// 80 chunks of at most 48 bytes: 3.8 KB of kernel parameters, 2.6 M parameter values per launch.
using SgdChunkList = ChunkList<SgdChunk, 80>;
using AdamChunkList = ChunkList<AdamChunk, 80>;

__device__ __forceinline__ bool step_skipped(const float* found_inf) {
  return found_inf && found_inf[0] != 0.0f;
}

// Blocks (b, *) zero chunk b.
__global__ void __launch_bounds__(kThreads) zero_kernel(FloatChunkList list) {
  const FloatChunk c = list.chunk[blockIdx.x];
  for (int i = chunk_begin(); i < c.numel; i += chunk_stride()) c.data[i] = 0.0f;
}

// The last move of the mixed-precision step, fused into the update: the new fp32 master is stored
// and the f16 or bf16 working copy that the next forward reads under autocast is rewritten from
// it, rounded to nearest even.
__device__ __forceinline__ void store_master(const ParamValues& p, int i, float w) {
  p.master[i] = w;
  if (!p.half) return;
  if (p.half_is_bf16)
    store_f(static_cast<__nv_bfloat16*>(p.half), i, w);
  else
    store_f(static_cast<__half*>(p.half), i, w);
}

// Blocks (b, *) update chunk b (PyTorch SGD, dampening 0; the momentum buffer starts at zero, so
// the first step's buffer is the gradient).
__global__ void __launch_bounds__(kThreads)
    sgd_kernel(SgdChunkList list, SgdParams sgd, const float* found_inf) {
  if (step_skipped(found_inf)) return;
  const SgdChunk c = list.chunk[blockIdx.x];
  float master[kChunkBatch], grad[kChunkBatch], buffer[kChunkBatch];
  for_each_chunk_value(
      c.param.numel,
      [&](int b, int i) {
        master[b] = c.param.master[i];
        grad[b] = c.param.grad[i];
        buffer[b] = c.momentum_buffer ? c.momentum_buffer[i] : 0.0f;
      },
      [&](int b, int i) {
        float w = master[b];
        const float d = grad[b] + sgd.weight_decay * w;
        if (c.momentum_buffer) {
          const float buf = sgd.momentum * buffer[b] + d;
          c.momentum_buffer[i] = buf;
          w -= sgd.lr * buf;
        } else {
          w -= sgd.lr * d;
        }
        store_master(c.param, i, w);
      });
}

// Blocks (b, *) update chunk b (PyTorch Adam with L2 weight decay, not AdamW). t = step[0] + 1: the
// step counter is incremented by a later launch, after every chunk has read it.
__global__ void __launch_bounds__(kThreads)
    adam_kernel(AdamChunkList list, AdamParams adam, const float* step, const float* found_inf) {
  if (step_skipped(found_inf)) return;
  const AdamChunk c = list.chunk[blockIdx.x];
  const float t = step[0] + 1.0f;
  // In double, as on the CPU (kernels/cpu/optim.cpp): the same two floats on both backends.
  const float bias_correction1 = float(1.0 - pow(double(adam.beta1), double(t)));
  const float bias_correction2 = float(1.0 - pow(double(adam.beta2), double(t)));
  float master[kChunkBatch], grad[kChunkBatch], exp_avg[kChunkBatch], exp_avg_sq[kChunkBatch];
  for_each_chunk_value(
      c.param.numel,
      [&](int b, int i) {
        master[b] = c.param.master[i];
        grad[b] = c.param.grad[i];
        exp_avg[b] = c.exp_avg[i];
        exp_avg_sq[b] = c.exp_avg_sq[i];
      },
      [&](int b, int i) {
        float w = master[b];
        const float d = grad[b] + adam.weight_decay * w;
        const float m = adam.beta1 * exp_avg[b] + (1.0f - adam.beta1) * d;
        const float v = adam.beta2 * exp_avg_sq[b] + (1.0f - adam.beta2) * d * d;
        c.exp_avg[i] = m;
        c.exp_avg_sq[i] = v;
        w -= adam.lr * (m / bias_correction1) / (sqrtf(v / bias_correction2) + adam.eps);
        store_master(c.param, i, w);
      });
}

__global__ void increment_step_kernel(float* step, const float* found_inf) {
  if (!step_skipped(found_inf)) step[0] += 1.0f;
}

// found_inf's device pointer, or nullptr when it is undefined (the step is never skipped).
const float* found_inf_ptr(const Tensor& found_inf) {
  return found_inf.defined() ? ptr<const float>(found_inf) : nullptr;
}

// The values of an optimizer state tensor from `offset` on, or nullptr when the step has none.
float* state_ptr(Tensor* state, int64_t offset) {
  return state ? ptr<float>(*state) + offset : nullptr;
}

// Splits every parameter into chunks, make_chunk(slot, offset, values) adding the step's state,
// and calls launch(list) for each full list and the rest.
template <class List, class MakeChunk, class Launch>
void for_each_chunk_list(const std::vector<ParamSlot>& params, MakeChunk make_chunk,
                         Launch launch) {
  ChunkBatcher<List, Launch> batcher(launch);
  for (const ParamSlot& slot : params) {
    const bool has_half = slot.half && slot.half->defined();
    const int64_t n = slot.master->numel();
    for (int64_t offset = 0; offset < n; offset += kChunkElements) {
      ParamValues values;
      values.master = ptr<float>(*slot.master) + offset;
      values.grad = ptr<const float>(*slot.grad) + offset;
      values.half = has_half ? static_cast<char*>(slot.half->raw()) + 2 * offset : nullptr;
      values.half_is_bf16 = has_half && slot.half->dtype() == DType::bf16;
      values.numel = int(std::min(kChunkElements, n - offset));
      batcher.push(make_chunk(slot, offset, values));
    }
  }
  batcher.flush();
}

} // namespace

void zero_grads(const std::vector<Tensor*>& grads) {
  require_zero_grads(grads);
  auto launch = [](const FloatChunkList& list) {
    zero_kernel<<<chunk_grid(list.count), kThreads, 0, stream()>>>(list);
    CUDA_CHECK_LAUNCH("zero_grads");
  };
  ChunkBatcher<FloatChunkList, decltype(launch)> batcher(launch);
  for (const Tensor* grad : grads) push_float_chunks(batcher, *grad);
  batcher.flush();
}

void sgd_step(const std::vector<ParamSlot>& params, const SgdParams& sgd, const Tensor& found_inf) {
  require_sgd_step(params, sgd, found_inf);
  const bool momentum = sgd.momentum != 0.0f;
  const float* skip = found_inf_ptr(found_inf);
  auto make_chunk = [&](const ParamSlot& slot, int64_t offset, const ParamValues& values) {
    return SgdChunk{values, momentum ? state_ptr(slot.momentum_buffer, offset) : nullptr};
  };
  for_each_chunk_list<SgdChunkList>(params, make_chunk, [&](const SgdChunkList& list) {
    sgd_kernel<<<chunk_grid(list.count), kThreads, 0, stream()>>>(list, sgd, skip);
    CUDA_CHECK_LAUNCH("sgd_step");
  });
}

void adam_step(const std::vector<ParamSlot>& params, const AdamParams& adam, Tensor& step,
               const Tensor& found_inf) {
  const char* op = "adam_step";
  require_adam_step(params, step, found_inf);
  const float* skip = found_inf_ptr(found_inf);
  auto make_chunk = [](const ParamSlot& slot, int64_t offset, const ParamValues& values) {
    return AdamChunk{values, state_ptr(slot.exp_avg, offset), state_ptr(slot.exp_avg_sq, offset)};
  };
  for_each_chunk_list<AdamChunkList>(params, make_chunk, [&](const AdamChunkList& list) {
    adam_kernel<<<chunk_grid(list.count), kThreads, 0, stream()>>>(list, adam,
                                                                   ptr<const float>(step), skip);
    CUDA_CHECK_LAUNCH(op);
  });
  increment_step_kernel<<<1, 1, 0, stream()>>>(ptr<float>(step), skip);
  CUDA_CHECK_LAUNCH(op);
}

} // namespace minamp::gpu
