// The kernels:: dispatcher: checks that an op's tensors share one device, then calls the CPU
// reference (minamp::cpu) or the CUDA backend (minamp::gpu), timed when the op profiler is on.
// The other argument checks are each op's require_<op> (kernels/checks.h), which both backends
// call first.
#include <initializer_list>

#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/profile.h"

namespace minamp::kernels {

namespace {

// The one device of all defined tensors in `tensors`; throws Error naming the op otherwise.
Device common_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t || !t->defined()) continue;
    if (!first) first = t;
    require(t->device() == first->device(), op, "all tensors must be on one device, got ",
            describe(*first), " and ", describe(*t));
  }
  require(first != nullptr, op, "no defined tensor to run on");
  return first->device();
}

Device common_device(const char* op, const std::vector<ParamSlot>& params) {
  Device device = Device::cpu;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSlot& p = params[i];
    Device d =
        common_device(op, {p.master, p.grad, p.half, p.momentum_buffer, p.exp_avg, p.exp_avg_sq});
    require(i == 0 || d == device, op, "all parameters must be on one device");
    device = d;
  }
  return device;
}

// The one device of the defined tensors in `grads`; throws Error naming the op otherwise.
Device common_device(const char* op, const std::vector<Tensor*>& grads) {
  const Tensor* first = nullptr;
  for (const Tensor* g : grads) {
    if (!g || !g->defined()) continue; // require_<op> names it
    if (!first) first = g;
    require(g->device() == first->device(), op, "gradients on two devices: ", describe(*first),
            " and ", describe(*g));
  }
  return first ? first->device() : Device::cpu;
}

#if !MINAMP_WITH_CUDA
[[noreturn]] void no_cuda(const char* op) {
  throw Error(cat(op, ": a tensor is on cuda but ", cuda_unavailable_reason()));
}
#endif

} // namespace

// Runs `call` from namespace cpu or gpu, timed by the op profiler when it is enabled. Without
// CUDA the gpu branch is never compiled.
#if MINAMP_WITH_CUDA
#define MINAMP_BACKEND_CALL(op, device, call) ((device) == Device::cpu ? cpu::call : gpu::call)
#else
#define MINAMP_BACKEND_CALL(op, device, call) ((device) == Device::cpu ? cpu::call : no_cuda(op))
#endif
#define MINAMP_DISPATCH(op, device, call)                                                          \
  do {                                                                                             \
    const Device dispatch_device = (device);                                                       \
    const profile::Scope profile_scope(op, dispatch_device);                                       \
    MINAMP_BACKEND_CALL(op, dispatch_device, call);                                                \
  } while (0)

void fill(Tensor& dst, float value) {
  MINAMP_DISPATCH("fill", common_device("fill", {&dst}), fill(dst, value));
}

void cast(const Tensor& src, Tensor& dst) {
  MINAMP_DISPATCH("cast", common_device("cast", {&src, &dst}), cast(src, dst));
}

void add_inplace(Tensor& dst, const Tensor& src, float alpha) {
  MINAMP_DISPATCH("add_inplace", common_device("add_inplace", {&src, &dst}),
                  add_inplace(dst, src, alpha));
}

void mul_scalar(const Tensor& src, const Tensor& scale, Tensor& dst) {
  MINAMP_DISPATCH("mul_scalar", common_device("mul_scalar", {&src, &scale, &dst}),
                  mul_scalar(src, scale, dst));
}

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
          const GemmEpilogue& epilogue) {
  MINAMP_DISPATCH("gemm",
                  common_device("gemm", {&a, &b, &c, epilogue.bias, epilogue.column_moments}),
                  gemm(a, trans_a, b, trans_b, c, epilogue));
}

void bias_backward(const Tensor& dy, Tensor& db) {
  MINAMP_DISPATCH("bias_backward", common_device("bias_backward", {&dy, &db}),
                  bias_backward(dy, db));
}

void add_forward(const Tensor& a, const Tensor& b, Tensor& y, bool relu) {
  MINAMP_DISPATCH("add_forward", common_device("add_forward", {&a, &b, &y}),
                  add_forward(a, b, y, relu));
}

void relu_forward(const Tensor& x, Tensor& y) {
  MINAMP_DISPATCH("relu_forward", common_device("relu_forward", {&x, &y}), relu_forward(x, y));
}

void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  MINAMP_DISPATCH("relu_backward", common_device("relu_backward", {&y, &dy, &dx}),
                  relu_backward(y, dy, dx));
}

void conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvParams& conv,
                    const GemmEpilogue& epilogue, const InputNormalization* input_norm) {
  const InputNormalization none;
  const InputNormalization& n = input_norm ? *input_norm : none;
  MINAMP_DISPATCH(
      "conv2d_forward",
      common_device("conv2d_forward", {&x, &w, &y, epilogue.bias, epilogue.column_moments, n.gamma,
                                       n.beta, n.mean, n.invstd, n.grad_sums}),
      conv2d_forward(x, w, y, conv, epilogue, input_norm));
}

void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                     const ConvParams& conv, const InputNormalization* input_norm) {
  const InputNormalization none;
  const InputNormalization& n = input_norm ? *input_norm : none;
  MINAMP_DISPATCH("conv2d_backward",
                  common_device("conv2d_backward", {&x, &w, &dy, &dx, &dw, n.gamma, n.beta, n.mean,
                                                    n.invstd, n.grad_sums}),
                  conv2d_backward(x, w, dy, dx, dw, conv, input_norm));
}

bool conv2d_normalizes_on_load(const Tensor& x, const Tensor& w, const ConvParams& conv) {
  if (x.device() == Device::cpu) return cpu::conv2d_normalizes_on_load(x, w, conv);
#if MINAMP_WITH_CUDA
  return gpu::conv2d_normalizes_on_load(x, w, conv);
#else
  return false;
#endif
}

void conv2d_backward_from_batchnorm(const Tensor& x, const Tensor& w,
                                    const BatchNormInputGrad& grad, Tensor& dw, Tensor& db,
                                    const ConvParams& conv) {
  const char* op = "conv2d_backward_from_batchnorm";
  MINAMP_DISPATCH(op,
                  common_device(op, {&x, &w, &grad.x, &grad.dy, &grad.gamma, &grad.beta, &grad.mean,
                                     &grad.invstd, &grad.grad_sums, &dw, &db}),
                  conv2d_backward_from_batchnorm(x, w, grad, dw, db, conv));
}

bool conv2d_reads_batchnorm_input_grad(const Tensor& x, const Tensor& w,
                                       const BatchNormInputGrad& grad, const ConvParams& conv) {
  if (x.device() == Device::cpu) return cpu::conv2d_reads_batchnorm_input_grad(x, w, grad, conv);
#if MINAMP_WITH_CUDA
  return gpu::conv2d_reads_batchnorm_input_grad(x, w, grad, conv);
#else
  return false;
#endif
}

void batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                       Tensor& mean, Tensor& invstd, Tensor& running_mean, Tensor& running_var,
                       const BatchNormParams& bn) {
  MINAMP_DISPATCH(
      "batchnorm_forward",
      common_device("batchnorm_forward", {&x, &gamma, &beta, &y, &mean, &invstd, &running_mean,
                                          &running_var, bn.batch_moments}),
      batchnorm_forward(x, gamma, beta, y, mean, invstd, running_mean, running_var, bn));
}

void batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                        const Tensor& mean, const Tensor& invstd, const Tensor& dy, Tensor& dx,
                        Tensor& dgamma, Tensor& dbeta, const BatchNormParams& bn) {
  MINAMP_DISPATCH("batchnorm_backward",
                  common_device("batchnorm_backward", {&x, &gamma, &beta, &mean, &invstd, &dy, &dx,
                                                       &dgamma, &dbeta, bn.grad_sums, bn.dx_sums}),
                  batchnorm_backward(x, gamma, beta, mean, invstd, dy, dx, dgamma, dbeta, bn));
}

void avgpool_forward(const Tensor& x, Tensor& y) {
  MINAMP_DISPATCH("avgpool_forward", common_device("avgpool_forward", {&x, &y}),
                  avgpool_forward(x, y));
}

void avgpool_backward(const Tensor& dy, Tensor& dx) {
  MINAMP_DISPATCH("avgpool_backward", common_device("avgpool_backward", {&dy, &dx}),
                  avgpool_backward(dy, dx));
}

void maxpool2d_forward(const Tensor& x, Tensor& y, Tensor& argmax, const MaxPoolParams& pool) {
  MINAMP_DISPATCH("maxpool2d_forward", common_device("maxpool2d_forward", {&x, &y, &argmax}),
                  maxpool2d_forward(x, y, argmax, pool));
}

void maxpool2d_backward(const Tensor& dy, const Tensor& argmax, Tensor& dx,
                        const MaxPoolParams& pool) {
  MINAMP_DISPATCH("maxpool2d_backward", common_device("maxpool2d_backward", {&dy, &argmax, &dx}),
                  maxpool2d_backward(dy, argmax, dx, pool));
}

void mse_forward(const Tensor& pred, const Tensor& target, Tensor& loss) {
  MINAMP_DISPATCH("mse_forward", common_device("mse_forward", {&pred, &target, &loss}),
                  mse_forward(pred, target, loss));
}

void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dpred) {
  MINAMP_DISPATCH("mse_backward", common_device("mse_backward", {&pred, &target, &dloss, &dpred}),
                  mse_backward(pred, target, dloss, dpred));
}

void cross_entropy_forward(const Tensor& logits, const Tensor& labels, Tensor& loss) {
  MINAMP_DISPATCH("cross_entropy_forward",
                  common_device("cross_entropy_forward", {&logits, &labels, &loss}),
                  cross_entropy_forward(logits, labels, loss));
}

void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& dloss,
                            Tensor& dlogits) {
  MINAMP_DISPATCH("cross_entropy_backward",
                  common_device("cross_entropy_backward", {&logits, &labels, &dloss, &dlogits}),
                  cross_entropy_backward(logits, labels, dloss, dlogits));
}

void sum_squares(const Tensor& x, Tensor& sum_sq) {
  MINAMP_DISPATCH("sum_squares", common_device("sum_squares", {&x, &sum_sq}),
                  sum_squares(x, sum_sq));
}

void clip_coefficient(const Tensor& sum_sq, float max_norm, Tensor& coef) {
  MINAMP_DISPATCH("clip_coefficient", common_device("clip_coefficient", {&sum_sq, &coef}),
                  clip_coefficient(sum_sq, max_norm, coef));
}

void amp_unscale(const std::vector<Tensor*>& grads, const Tensor& scale, Tensor& found_inf) {
  const Device device = common_device("amp_unscale", {&scale, &found_inf});
  for (const Tensor* g : grads)
    require(!g || !g->defined() || g->device() == device, "amp_unscale", "gradient ", describe(g),
            " is not on ", device, " with the scale");
  MINAMP_DISPATCH("amp_unscale", device, amp_unscale(grads, scale, found_inf));
}

void amp_update_scale(Tensor& scale, Tensor& growth_tracker, const Tensor& found_inf,
                      const ScalerParams& scaler) {
  MINAMP_DISPATCH("amp_update_scale",
                  common_device("amp_update_scale", {&scale, &growth_tracker, &found_inf}),
                  amp_update_scale(scale, growth_tracker, found_inf, scaler));
}

void zero_grads(const std::vector<Tensor*>& grads) {
  if (grads.empty()) return;
  MINAMP_DISPATCH("zero_grads", common_device("zero_grads", grads), zero_grads(grads));
}

void sgd_step(const std::vector<ParamSlot>& params, const SgdParams& sgd, const Tensor& found_inf) {
  if (params.empty()) return;
  const Device device = common_device("sgd_step", params);
  require(!found_inf.defined() || found_inf.device() == device, "sgd_step", "found_inf is on ",
          found_inf.device(), ", the parameters on ", device);
  MINAMP_DISPATCH("sgd_step", device, sgd_step(params, sgd, found_inf));
}

void adam_step(const std::vector<ParamSlot>& params, const AdamParams& adam, Tensor& step,
               const Tensor& found_inf) {
  if (params.empty()) return;
  const Device device = common_device("adam_step", params);
  require(step.device() == device && (!found_inf.defined() || found_inf.device() == device),
          "adam_step", "step and found_inf must be on the parameters' device ", device);
  MINAMP_DISPATCH("adam_step", device, adam_step(params, adam, step, found_inf));
}

void range_counts(const Tensor& x, float scale, DType format, Tensor& counts) {
  MINAMP_DISPATCH("range_counts", common_device("range_counts", {&x, &counts}),
                  range_counts(x, scale, format, counts));
}

} // namespace minamp::kernels
