// The argument checks shared by the CPU and CUDA kernels.
#include "kernels/checks.h"

namespace minamp {

void require_floating(const char* op, const char* name, const Tensor& tensor) {
  require(tensor.defined() && is_floating(tensor.dtype()), op, name,
          " must be a defined f32 or f16 tensor, got ", describe(tensor));
}

void require_f32(const char* op, const char* name, const Tensor& tensor, int64_t numel) {
  require(tensor.defined() && tensor.dtype() == DType::f32 && tensor.numel() == numel, op, name,
          " must be f32 with ", numel, " elements, got ", describe(tensor));
}

void require_same_numel(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                        const Tensor& b) {
  require(a.defined() && b.defined() && a.numel() == b.numel(), op, name_a, " and ", name_b,
          " must have the same number of elements, got ", describe(a), " and ", describe(b));
}

void require_param_slot(const char* op, const ParamSlot& slot, int states) {
  require(slot.master && slot.master->defined(), op, "every parameter needs a master tensor");
  const int64_t n = slot.master->numel();
  require_f32(op, "master", *slot.master, n);
  require(slot.grad != nullptr, op, "parameter ", describe(*slot.master), " has no gradient");
  require_f32(op, "grad", *slot.grad, n);
  if (states > 0) {
    require(slot.state0 != nullptr, op, "parameter ", describe(*slot.master), " has no state0");
    require_f32(op, "state0", *slot.state0, n);
  }
  if (states > 1) {
    require(slot.state1 != nullptr, op, "parameter ", describe(*slot.master), " has no state1");
    require_f32(op, "state1", *slot.state1, n);
  }
  if (slot.half && slot.half->defined())
    require(slot.half->dtype() == DType::f16 && slot.half->numel() == n, op, "the f16 copy of ",
            describe(*slot.master), " must be f16 of the same size, got ", describe(*slot.half));
}

namespace {

// Checks x [rows, C], gamma and beta f32 [C]; returns the dims.
BatchNormDims batchnorm_dims(const char* op, const Tensor& x, const Tensor& gamma,
                             const Tensor& beta) {
  require_floating(op, "x", x);
  require(x.shape().rank() >= 2, op, "expects x [rows, C] or [N, H, W, C], got ", describe(x));
  const BatchNormDims d{x.shape().rows(), x.shape().last()};
  require_f32(op, "gamma", gamma, d.channels);
  require_f32(op, "beta", beta, d.channels);
  return d;
}

PoolDims pool_dims(const char* op, const Tensor& x) {
  require(x.shape().rank() == 4, op, "expects x [N, H, W, C], got ", describe(x));
  return {x.shape()[0], x.shape()[1] * x.shape()[2], x.shape()[3]};
}

// Throws Error unless `pooled` holds [N, C] values.
void require_pooled(const char* op, const char* name, const Tensor& pooled, const PoolDims& d) {
  require_floating(op, name, pooled);
  require(pooled.numel() == d.n * d.channels && pooled.shape().last() == d.channels, op, "expects ",
          name, " [", d.n, ", ", d.channels, "], got ", describe(pooled));
}

} // namespace

BatchNormDims require_batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                        const Tensor& y, const Tensor& mean, const Tensor& invstd,
                                        const Tensor& running_mean, const Tensor& running_var,
                                        const BatchNormParams& bn) {
  const char* op = "batchnorm_forward";
  const BatchNormDims d = batchnorm_dims(op, x, gamma, beta);
  require(y.defined() && y.dtype() == x.dtype() && y.shape() == x.shape(), op,
          "expects y shaped and typed like x ", describe(x), ", got ", describe(y));
  require(y.raw() != x.raw() || x.numel() == 0, op,
          "y must be a tensor of its own, not x (in-place batch norm is not supported)");
  for (const Tensor* t : {&mean, &invstd, &running_mean, &running_var})
    require_f32(op, "mean, invstd, running_mean and running_var", *t, d.channels);
  require(!bn.training || d.rows > 1, op, "training needs more than one value per channel, got ",
          describe(x));
  return d;
}

BatchNormDims require_batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                         const Tensor& mean, const Tensor& invstd, const Tensor& dy,
                                         const Tensor& dx, const Tensor& dgamma,
                                         const Tensor& dbeta) {
  const char* op = "batchnorm_backward";
  const BatchNormDims d = batchnorm_dims(op, x, gamma, beta);
  require_floating(op, "dy", dy);
  require(dy.shape() == x.shape() && dx.defined() && is_floating(dx.dtype()) &&
              dx.shape() == x.shape(),
          op, "expects dy and dx shaped like x ", describe(x), ", got dy ", describe(dy), ", dx ",
          describe(dx));
  require((dx.raw() != x.raw() && dx.raw() != dy.raw()) || x.numel() == 0, op,
          "dx must be a tensor of its own, not x or dy (in place is not supported)");
  for (const Tensor* t : {&mean, &invstd, &dgamma, &dbeta})
    require_f32(op, "mean, invstd, dgamma and dbeta", *t, d.channels);
  return d;
}

PoolDims require_avgpool_forward(const Tensor& x, const Tensor& y) {
  require_floating("avgpool_forward", "x", x);
  const PoolDims d = pool_dims("avgpool_forward", x);
  require_pooled("avgpool_forward", "y", y, d);
  require(y.dtype() == x.dtype(), "avgpool_forward", "expects y of x's dtype, got x ", describe(x),
          ", y ", describe(y));
  return d;
}

PoolDims require_avgpool_backward(const Tensor& dy, const Tensor& dx) {
  require_floating("avgpool_backward", "dx", dx);
  const PoolDims d = pool_dims("avgpool_backward", dx);
  require_pooled("avgpool_backward", "dy", dy, d);
  return d;
}

MaxPoolDims maxpool2d_dims(const char* op, const char* name, const Tensor& x,
                           const MaxPoolParams& pool) {
  require_floating(op, name, x);
  require(x.shape().rank() == 4, op, "expects ", name, " [N, H, W, C], got ", describe(x));
  require(pool.kernel >= 1 && pool.stride >= 1 && pool.pad >= 0 && pool.pad <= pool.kernel / 2, op,
          "expects kernel >= 1, stride >= 1 and 0 <= pad <= kernel / 2, got kernel ", pool.kernel,
          ", stride ", pool.stride, ", pad ", pool.pad);
  MaxPoolDims d{};
  d.n = x.shape()[0], d.h = x.shape()[1], d.w = x.shape()[2], d.c = x.shape()[3];
  d.kernel = pool.kernel, d.stride = pool.stride, d.pad = pool.pad;
  require(d.h + 2 * d.pad >= d.kernel && d.w + 2 * d.pad >= d.kernel, op, "the ", d.kernel, "x",
          d.kernel, " window does not fit the padded input ", describe(x), " (pad ", d.pad, ")");
  d.ho = (d.h + 2 * d.pad - d.kernel) / d.stride + 1;
  d.wo = (d.w + 2 * d.pad - d.kernel) / d.stride + 1;
  return d;
}

namespace {

// Throws Error unless `t` is defined, [N, Ho, Wo, C] and of a dtype `dtype_ok` takes (`dtypes`).
void require_pooled_map(const char* op, const char* name, const Tensor& t, const MaxPoolDims& d,
                        const char* dtypes, bool (*dtype_ok)(DType)) {
  require(t.defined() && dtype_ok(t.dtype()) && t.shape() == Shape{d.n, d.ho, d.wo, d.c}, op,
          "expects ", name, " ", dtypes, " [", d.n, ", ", d.ho, ", ", d.wo, ", ", d.c, "] (kernel ",
          d.kernel, ", stride ", d.stride, ", pad ", d.pad, "), got ", describe(t));
}

bool is_i32(DType dtype) { return dtype == DType::i32; }

} // namespace

MaxPoolDims require_maxpool2d_forward(const Tensor& x, const Tensor& y, const Tensor& argmax,
                                      const MaxPoolParams& pool) {
  const char* op = "maxpool2d_forward";
  const MaxPoolDims d = maxpool2d_dims(op, "x", x, pool);
  require_pooled_map(op, "y", y, d, "f32/f16", is_floating);
  require(y.dtype() == x.dtype(), op, "expects y of x's dtype, got x ", describe(x), ", y ",
          describe(y));
  if (argmax.defined()) require_pooled_map(op, "argmax", argmax, d, "i32", is_i32);
  return d;
}

MaxPoolDims require_maxpool2d_backward(const Tensor& dy, const Tensor& argmax, const Tensor& dx,
                                       const MaxPoolParams& pool) {
  const char* op = "maxpool2d_backward";
  const MaxPoolDims d = maxpool2d_dims(op, "dx", dx, pool);
  require_pooled_map(op, "dy", dy, d, "f32/f16", is_floating);
  require_pooled_map(op, "argmax", argmax, d, "i32", is_i32);
  return d;
}

LogitDims require_logits_and_labels(const char* op, const Tensor& logits, const Tensor& labels) {
  require_floating(op, "logits", logits);
  require(logits.shape().rank() == 2, op, "expects logits [N, K], got ", describe(logits));
  const LogitDims d{logits.shape()[0], logits.shape()[1]};
  require(labels.defined() && labels.dtype() == DType::i32 && labels.numel() == d.rows, op,
          "expects labels i32 [", d.rows, "] for logits ", describe(logits), ", got ",
          describe(labels));
  return d;
}

LogitDims require_cross_entropy_backward(const Tensor& logits, const Tensor& labels,
                                         const Tensor& dloss, const Tensor& dlogits) {
  const char* op = "cross_entropy_backward";
  const LogitDims d = require_logits_and_labels(op, logits, labels);
  require_f32(op, "dloss", dloss, 1);
  require(dlogits.defined() && is_floating(dlogits.dtype()) && dlogits.shape() == logits.shape(),
          op, "expects dlogits shaped like logits ", describe(logits), ", got ", describe(dlogits));
  return d;
}

void require_add_forward(const Tensor& a, const Tensor& b, const Tensor& y) {
  require_floating("add_forward", "a", a);
  require_floating("add_forward", "b", b);
  require_floating("add_forward", "y", y);
  require_same_numel("add_forward", "a", a, "b", b);
  require_same_numel("add_forward", "a", a, "y", y);
}

void require_relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  require_floating("relu_backward", "y", y);
  require_floating("relu_backward", "dy", dy);
  require_floating("relu_backward", "dx", dx);
  require_same_numel("relu_backward", "y", y, "dy", dy);
  require_same_numel("relu_backward", "dy", dy, "dx", dx);
}

void require_conv_gradients(const Tensor& x, const Tensor& w, const Tensor& dx, const Tensor& dw) {
  if (dx.defined())
    require(is_floating(dx.dtype()) && dx.shape() == x.shape(), "conv2d_backward",
            "expects dx shaped like x ", describe(x), ", got ", describe(dx));
  if (dw.defined())
    require(dw.dtype() == DType::f32 && dw.shape() == w.shape(), "conv2d_backward",
            "expects dw f32 shaped like w ", describe(w), ", got ", describe(dw));
}

} // namespace minamp
