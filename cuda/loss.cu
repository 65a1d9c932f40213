// CUDA losses, in fp32 whatever the input dtype: mean squared error, and softmax cross-entropy
// with the row max subtracted before exp. Each loss is an f32 [1] tensor; the backward kernels
// read the incoming gradient dloss[0] on the device.
//
// Labels live on the device, so a label outside [0, K) cannot be reported without a host read.
// Such a label is never used as an index: its row's loss and its row of dlogits are NaN, so the
// loss printed by the training loop shows the problem at once. Data loaders are expected to
// validate labels on the host where they read them (the CPU reference throws an Error).
#include <cmath>

#include "common.cuh"
#include "device.cuh"
#include "kernels/kernels.h"
#include "reduce.cuh"

namespace minamp::gpu {

namespace {

constexpr int kThreads = 256;

// ---- Mean squared error.

template <class TP, class TT> struct SquaredError { // (pred[i] - target[i])^2
  const TP* pred;
  const TT* target;
  __device__ void operator()(int64_t i, float (&v)[1]) const {
    const float diff = load_f(pred, i) - load_f(target, i);
    v[0] = diff * diff;
  }
};
struct StoreMean { // loss[0] = total / count (NaN when count is 0, as the mean of nothing)
  float* loss;
  float count;
  __device__ void operator()(float (&total)[1]) const { loss[0] = total[0] / count; }
};

// dpred = dloss[0] * 2 (pred - target) / n.
template <class TP, class TT, class TD>
__global__ void __launch_bounds__(kThreads)
    mse_backward_kernel(const TP* pred, const TT* target, const float* dloss, TD* dpred,
                        int64_t n) {
  const float factor = dloss[0] * 2.0f / float(n);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    store_f(dpred, i, factor * (load_f(pred, i) - load_f(target, i)));
}

// ---- Cross-entropy: one warp per row of logits [N, K], lanes striding over the K classes.

struct SoftmaxStats {
  float max; // the row's largest logit
  float sum; // sum over the row of exp(z - max)
};

// The row's max and sum of exp(z - max), computed by the whole warp; every lane gets them.
template <class T>
__device__ SoftmaxStats row_softmax_stats(const T* row, int64_t classes, int lane) {
  float max = -INFINITY;
  for (int64_t k = lane; k < classes; k += 32) max = fmaxf(max, load_f(row, k));
  max = warp_max(max);
  float sum = 0.0f;
  for (int64_t k = lane; k < classes; k += 32) sum += expf(load_f(row, k) - max);
  return {max, warp_sum(sum)};
}

__device__ __forceinline__ bool label_valid(int32_t label, int64_t classes) {
  return label >= 0 && label < classes;
}

// partials[block] = sum of -log softmax(row)[label] over the rows of this block's warps.
template <class T>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_rows_kernel(const T* logits, const int32_t* labels, int64_t rows, int64_t classes,
                              float* partials) {
  const int lane = threadIdx.x % 32;
  const int64_t first_row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  float loss_sum = 0.0f;                              // kept by lane 0
  for (int64_t r = first_row; r < rows; r += warps) { // warp-uniform: all lanes take each row
    const T* row = logits + r * classes;
    const SoftmaxStats s = row_softmax_stats(row, classes, lane);
    const int32_t label = labels[r];
    const float picked = label_valid(label, classes) ? load_f(row, label) : NAN;
    if (lane == 0) loss_sum += s.max + logf(s.sum) - picked;
  }
  const float total = block_sum(loss_sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// dlogits = dloss[0] * (softmax(logits) - onehot(label)) / N.
template <class T, class TD>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_backward_kernel(const T* logits, const int32_t* labels, const float* dloss,
                                  TD* dlogits, int64_t rows, int64_t classes) {
  const int lane = threadIdx.x % 32;
  const int64_t first_row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  const float factor = dloss[0] / float(rows);
  for (int64_t r = first_row; r < rows; r += warps) {
    const T* row = logits + r * classes;
    const SoftmaxStats s = row_softmax_stats(row, classes, lane);
    const int32_t label = labels[r];
    const bool valid = label_valid(label, classes);
    for (int64_t k = lane; k < classes; k += 32) {
      const float prob = expf(load_f(row, k) - s.max) / s.sum;
      const float grad = valid ? factor * (prob - (k == label ? 1.0f : 0.0f)) : NAN;
      store_f(dlogits, r * classes + k, grad);
    }
  }
}

} // namespace

void mse_forward(const Tensor& pred, const Tensor& target, Tensor& loss) {
  const char* op = "mse_forward";
  require_mse_forward(pred, target, loss);
  visit_floating(pred, op, [&](auto pred_type) {
    visit_floating(target, op, [&](auto target_type) {
      using TP = typename decltype(pred_type)::type;
      using TT = typename decltype(target_type)::type;
      reduce_all<1>(pred.numel(), SquaredError<TP, TT>{ptr<const TP>(pred), ptr<const TT>(target)},
                    StoreMean{ptr<float>(loss), float(pred.numel())}, op);
    });
  });
}

void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dpred) {
  const char* op = "mse_backward";
  require_mse_backward(pred, target, dloss, dpred);
  if (pred.numel() == 0) return;
  visit_floating(pred, op, [&](auto pred_type) {
    visit_floating(target, op, [&](auto target_type) {
      visit_floating(dpred, op, [&](auto grad_type) {
        using TP = typename decltype(pred_type)::type;
        using TT = typename decltype(target_type)::type;
        using TD = typename decltype(grad_type)::type;
        mse_backward_kernel<<<grid_for(pred.numel(), kThreads), kThreads, 0, stream()>>>(
            ptr<const TP>(pred), ptr<const TT>(target), ptr<const float>(dloss), ptr<TD>(dpred),
            pred.numel());
        CUDA_CHECK_LAUNCH(op);
      });
    });
  });
}

void cross_entropy_forward(const Tensor& logits, const Tensor& labels, Tensor& loss) {
  const char* op = "cross_entropy_forward";
  const LogitDims d = require_cross_entropy_forward(logits, labels, loss);
  const int blocks = grid_for(d.rows * 32, kThreads);
  Tensor partials = Tensor::empty({blocks}, DType::f32, Device::cuda);
  visit_floating(logits, op, [&](auto type) {
    using T = typename decltype(type)::type;
    cross_entropy_rows_kernel<<<blocks, kThreads, 0, stream()>>>(
        ptr<const T>(logits), ptr<const int32_t>(labels), d.rows, d.classes, ptr<float>(partials));
    CUDA_CHECK_LAUNCH(op);
  });
  sum_finish_kernel<1><<<1, kReduceThreads, 0, stream()>>>(
      ptr<const float>(partials), blocks, StoreMean{ptr<float>(loss), float(d.rows)});
  CUDA_CHECK_LAUNCH(op);
}

void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& dloss,
                            Tensor& dlogits) {
  const char* op = "cross_entropy_backward";
  const LogitDims d = require_cross_entropy_backward(logits, labels, dloss, dlogits);
  if (logits.numel() == 0) return;
  visit_floating(logits, op, [&](auto logits_type) {
    visit_floating(dlogits, op, [&](auto grad_type) {
      using T = typename decltype(logits_type)::type;
      using TD = typename decltype(grad_type)::type;
      cross_entropy_backward_kernel<<<grid_for(d.rows * 32, kThreads), kThreads, 0, stream()>>>(
          ptr<const T>(logits), ptr<const int32_t>(labels), ptr<const float>(dloss),
          ptr<TD>(dlogits), d.rows, d.classes);
      CUDA_CHECK_LAUNCH(op);
    });
  });
}

} // namespace minamp::gpu
