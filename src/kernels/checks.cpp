// The argument checks of every kernel, shared by the CPU and CUDA backends.
#include "kernels/checks.h"

#include <cstdint>

namespace minamp {

void require_floating(const char* op, const char* name, const Tensor& tensor) {
  require(tensor.defined() && is_floating(tensor.dtype()), op, name,
          " must be a defined f32, f16 or bf16 tensor, got ", describe(tensor));
}

void require_f32(const char* op, const char* name, const Tensor& tensor, int64_t numel) {
  require(tensor.defined() && tensor.dtype() == DType::f32 && tensor.numel() == numel, op, name,
          " must be f32 with ", numel, " elements, got ", describe(tensor));
}

// Throws Error unless `tensor` is f32 [2, channels]; `rows` says what its two rows hold.
void require_two_per_channel(const char* op, const char* name, const Tensor& tensor,
                             int64_t channels, const char* rows) {
  require(tensor.defined() && tensor.dtype() == DType::f32 && tensor.shape() == Shape{2, channels},
          op, name, " must be f32 [2, ", channels, "] (", rows, " per channel), got ",
          describe(tensor));
}

void require_moments(const char* op, const char* name, const Tensor& tensor, int64_t channels) {
  require_two_per_channel(op, name, tensor, channels, "mean and variance");
}

void require_grad_sums(const char* op, const char* name, const Tensor& tensor, int64_t channels) {
  require_two_per_channel(op, name, tensor, channels, "sum dy_hat and sum dy_hat * xhat");
}

void require_column_moments(const char* op, const GemmEpilogue& epilogue, int64_t m, int64_t n) {
  if (!epilogue.column_moments) return;
  require_moments(op, "column_moments", *epilogue.column_moments, n);
  require(m >= 1, op, "column_moments needs at least one row of output, got none");
}

void require_same_numel(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                        const Tensor& b) {
  require(a.defined() && b.defined() && a.numel() == b.numel(), op, name_a, " and ", name_b,
          " must have the same number of elements, got ", describe(a), " and ", describe(b));
}

void require_fill(const Tensor& dst, float value) {
  require(dst.defined(), "fill", "dst is an undefined tensor");
  require(dst.dtype() != DType::i32 || fits_int32(value), "fill", "an i32 tensor cannot hold ",
          value, ", got ", describe(dst));
}

void require_cast(const Tensor& src, const Tensor& dst) {
  require_same_numel("cast", "src", src, "dst", dst);
}

void require_add_inplace(const Tensor& dst, const Tensor& src) {
  require_floating("add_inplace", "dst", dst);
  require_floating("add_inplace", "src", src);
  require_same_numel("add_inplace", "dst", dst, "src", src);
}

void require_mul_scalar(const Tensor& src, const Tensor& scale, const Tensor& dst) {
  require_floating("mul_scalar", "src", src);
  require_floating("mul_scalar", "dst", dst);
  require_same_numel("mul_scalar", "src", src, "dst", dst);
  require_f32("mul_scalar", "scale", scale, 1);
}

namespace {

// True when the bytes of `a` and `b` overlap (e.g. two views of one storage).
bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0 || a.device() != b.device()) return false;
  const auto a_begin = reinterpret_cast<uintptr_t>(a.raw());
  const auto b_begin = reinterpret_cast<uintptr_t>(b.raw());
  return a_begin < b_begin + uintptr_t(b.nbytes()) && b_begin < a_begin + uintptr_t(a.nbytes());
}

} // namespace

GemmDims require_gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                      const GemmEpilogue& epilogue) {
  require_floating("gemm", "A", a);
  require_floating("gemm", "B", b);
  require_floating("gemm", "C", c);
  require(a.dtype() == b.dtype(), "gemm", "A and B must share a floating dtype, got ", a.dtype(),
          " and ", b.dtype());
  require(!is_half_precision(a.dtype()) || c.dtype() == DType::f32 || c.dtype() == a.dtype(),
          "gemm", "C must be f32 or the dtype of A and B (", a.dtype(), "), got ", describe(c));
  const GemmDims d{trans_a ? a.shape().last() : a.shape().rows(),
                   trans_b ? b.shape().rows() : b.shape().last(),
                   trans_a ? a.shape().rows() : a.shape().last()};
  const int64_t k_of_b = trans_b ? b.shape().last() : b.shape().rows();
  require(k_of_b == d.k && c.shape().rows() == d.m && c.shape().last() == d.n, "gemm",
          "expected op(A) [M, K], op(B) [K, N], C [M, N], got A ", describe(a),
          (trans_a ? " (transposed)" : ""), ", B ", describe(b), (trans_b ? " (transposed)" : ""),
          ", C ", describe(c));
  if (epilogue.bias) require_f32("gemm", "bias", *epilogue.bias, d.n);
  require_column_moments("gemm", epilogue, d.m, d.n);
  // Tiles of C are written while other tiles still read A and B (on either backend).
  require(!overlaps(c, a) && !overlaps(c, b), "gemm", "C ", describe(c),
          " shares memory with A or B; the product needs an output of its own");
  return d;
}

void require_bias_backward(const Tensor& dy, const Tensor& db) {
  require_floating("bias_backward", "dy", dy);
  require_f32("bias_backward", "db", db, dy.shape().last());
}

void require_relu_forward(const Tensor& x, const Tensor& y) {
  require_floating("relu_forward", "x", x);
  require(y.defined() && y.dtype() == x.dtype() && y.numel() == x.numel(), "relu_forward",
          "y must match x ", describe(x), ", got ", describe(y));
}

void require_relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  require_floating("relu_backward", "y", y);
  require_floating("relu_backward", "dy", dy);
  require_floating("relu_backward", "dx", dx);
  require_same_numel("relu_backward", "y", y, "dy", dy);
  require_same_numel("relu_backward", "dy", dy, "dx", dx);
}

namespace {

// Checks x [N, H, W, Cin], w [Cout, kh, kw, Cin] and the conv parameters; returns the dims.
ConvDims conv_dims(const char* op, const Tensor& x, const Tensor& w, const ConvParams& conv) {
  require(x.defined() && x.shape().rank() == 4 && is_floating(x.dtype()), op,
          "expects x f32/f16/bf16 [N, H, W, Cin], got ", describe(x));
  require(w.defined() && w.shape().rank() == 4 && w.shape()[3] == x.shape()[3] &&
              is_floating(w.dtype()),
          op, "expects w f32/f16/bf16 [Cout, kh, kw, Cin] with the Cin of x ", describe(x),
          ", got ", describe(w));
  require(conv.stride >= 1 && conv.pad >= 0, op, "expects stride >= 1 and pad >= 0, got stride ",
          conv.stride, ", pad ", conv.pad);
  ConvDims d{};
  d.n = x.shape()[0], d.h = x.shape()[1], d.w = x.shape()[2], d.cin = x.shape()[3];
  d.cout = w.shape()[0], d.kh = w.shape()[1], d.kw = w.shape()[2];
  d.stride = conv.stride, d.pad = conv.pad;
  require(d.h + 2 * d.pad >= d.kh && d.w + 2 * d.pad >= d.kw, op, "the kernel of ", describe(w),
          " does not fit the padded input ", describe(x), " (pad ", d.pad, ")");
  d.ho = (d.h + 2 * d.pad - d.kh) / d.stride + 1;
  d.wo = (d.w + 2 * d.pad - d.kw) / d.stride + 1;
  return d;
}

// Unless `y` is a floating [N, Ho, Wo, Cout] tensor for these dims.
void require_conv_output(const char* op, const char* name, const Tensor& y, const ConvDims& d) {
  require(y.defined() && is_floating(y.dtype()) && y.shape() == Shape{d.n, d.ho, d.wo, d.cout}, op,
          "expects ", name, " f32/f16/bf16 [", d.n, ", ", d.ho, ", ", d.wo, ", ", d.cout,
          "] (stride ", d.stride, ", pad ", d.pad, "), got ", describe(y));
}

} // namespace

namespace {

// Throws Error unless `norm` (when given) holds f32 [Cin] vectors for a conv that can apply it as
// it loads x (conv2d_normalizes_on_load).
void require_input_normalization(const char* op, const InputNormalization* norm, const Tensor& x,
                                 const Tensor& w, const ConvDims& d, bool normalizes_on_load) {
  if (!norm) return;
  for (const Tensor* t : {norm->gamma, norm->beta, norm->mean, norm->invstd}) {
    require(t != nullptr, op, "input_norm needs gamma, beta, mean and invstd");
    require_f32(op, "input_norm's gamma, beta, mean and invstd", *t, d.cin);
  }
  require(normalizes_on_load, op, "cannot batch-normalise x as it loads it for x ", describe(x),
          ", w ", describe(w), ", stride ", d.stride, ", pad ", d.pad,
          " (only a 1x1, stride-1, unpadded conv in one dtype on CUDA, see "
          "conv2d_normalizes_on_load)");
}

// Throws Error unless input_norm's grad_sums (when given) is f32 [2, Cin] for a conv2d_backward
// that writes dx in x's dtype.
void require_input_norm_grad_sums(const InputNormalization* norm, const Tensor& x, const Tensor& dx,
                                  const ConvDims& d) {
  const char* op = "conv2d_backward";
  if (!norm || !norm->grad_sums) return;
  require_grad_sums(op, "input_norm's grad_sums", *norm->grad_sums, d.cin);
  require(dx.defined() && dx.dtype() == x.dtype(), op,
          "input_norm's grad_sums are sums over dx: it needs dx in x's dtype ", x.dtype(), ", got ",
          describe(dx));
}

} // namespace

ConvDims require_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& y,
                                const ConvParams& conv, const GemmEpilogue& epilogue,
                                const InputNormalization* input_norm, bool normalizes_on_load) {
  const ConvDims d = conv_dims("conv2d_forward", x, w, conv);
  require_conv_output("conv2d_forward", "y", y, d);
  if (epilogue.bias) require_f32("conv2d_forward", "bias", *epilogue.bias, d.cout);
  require_column_moments("conv2d_forward", epilogue, d.n * d.out_pixels(), d.cout);
  require_input_normalization("conv2d_forward", input_norm, x, w, d, normalizes_on_load);
  require(!input_norm || !input_norm->grad_sums, "conv2d_forward",
          "input_norm's grad_sums are written by conv2d_backward only");
  return d;
}

ConvDims require_conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                 const Tensor& dx, const Tensor& dw, const ConvParams& conv,
                                 const InputNormalization* input_norm, bool normalizes_on_load) {
  const char* op = "conv2d_backward";
  const ConvDims d = conv_dims(op, x, w, conv);
  require_input_normalization(op, input_norm, x, w, d, normalizes_on_load);
  require_conv_output(op, "dy", dy, d);
  if (dx.defined())
    require(is_floating(dx.dtype()) && dx.shape() == x.shape(), op, "expects dx shaped like x ",
            describe(x), ", got ", describe(dx));
  if (dw.defined())
    require(dw.dtype() == DType::f32 && dw.shape() == w.shape(), op,
            "expects dw f32 shaped like w ", describe(w), ", got ", describe(dw));
  require_input_norm_grad_sums(input_norm, x, dx, d);
  return d;
}

ConvDims require_conv2d_backward_from_batchnorm(const Tensor& x, const Tensor& w,
                                                const BatchNormInputGrad& grad, const Tensor& dw,
                                                const Tensor& db, const ConvParams& conv,
                                                bool reads_batchnorm_grad) {
  const char* op = "conv2d_backward_from_batchnorm";
  const ConvDims d = conv_dims(op, x, w, conv);
  require_conv_output(op, "the batch norm's x", grad.x, d);
  require(grad.dy.defined() && grad.dy.shape() == grad.x.shape() &&
              grad.dy.dtype() == grad.x.dtype(),
          op, "expects the batch norm's dy shaped and typed like its x ", describe(grad.x),
          ", got ", describe(grad.dy));
  for (const Tensor* t : {&grad.gamma, &grad.beta, &grad.mean, &grad.invstd})
    require_f32(op, "the batch norm's gamma, beta, mean and invstd", *t, d.cout);
  require_grad_sums(op, "the batch norm's grad_sums", grad.grad_sums, d.cout);
  require(dw.defined() || db.defined(), op, "expects dw, db or both, got neither");
  if (dw.defined())
    require(dw.dtype() == DType::f32 && dw.shape() == w.shape(), op,
            "expects dw f32 shaped like w ", describe(w), ", got ", describe(dw));
  if (db.defined()) require_f32(op, "db", db, d.cout);
  require(reads_batchnorm_grad, op, "cannot read the batch norm's input gradient unwritten for x ",
          describe(x), ", w ", describe(w), ", the batch norm's x ", describe(grad.x),
          " (only a 1x1 conv with few input channels over many pixels, in one dtype, on CUDA, see "
          "conv2d_reads_batchnorm_input_grad)");
  return d;
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
  require(!y.defined() || (y.dtype() == x.dtype() && y.shape() == x.shape()), op,
          "expects y shaped and typed like x ", describe(x), ", got ", describe(y));
  require(!y.defined() || y.raw() != x.raw() || x.numel() == 0, op,
          "y must be a tensor of its own, not x (in-place batch norm is not supported)");
  for (const Tensor* t : {&mean, &invstd, &running_mean, &running_var})
    require_f32(op, "mean, invstd, running_mean and running_var", *t, d.channels);
  require(!bn.training || d.rows > 1, op, "training needs more than one value per channel, got ",
          describe(x));
  if (bn.batch_moments) {
    require(bn.training, op, "batch_moments are batch statistics, for training mode only");
    require_moments(op, "batch_moments", *bn.batch_moments, d.channels);
  }
  require(!bn.grad_sums && !bn.dx_sums, op,
          "grad_sums and dx_sums are for batchnorm_backward only");
  return d;
}

BatchNormDims require_batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                         const Tensor& mean, const Tensor& invstd, const Tensor& dy,
                                         const Tensor& dx, const Tensor& dgamma,
                                         const Tensor& dbeta, const BatchNormParams& bn) {
  const char* op = "batchnorm_backward";
  const BatchNormDims d = batchnorm_dims(op, x, gamma, beta);
  require_floating(op, "dy", dy);
  require(dgamma.defined() == dbeta.defined() && (dx.defined() || dgamma.defined()), op,
          "expects dx, or dgamma and dbeta, or all three, got dx ", describe(dx), ", dgamma ",
          describe(dgamma), ", dbeta ", describe(dbeta));
  require(dy.shape() == x.shape() &&
              (!dx.defined() || (is_floating(dx.dtype()) && dx.shape() == x.shape())),
          op, "expects dy and dx shaped like x ", describe(x), ", got dy ", describe(dy), ", dx ",
          describe(dx));
  if (dx.defined()) {
    // dx may be dy itself (each element of dx needs only its own dy), never x or part of either.
    const bool over_dy = dx.raw() == dy.raw() && dx.dtype() == dy.dtype();
    require(!overlaps(dx, x) && (over_dy || !overlaps(dx, dy)), op,
            "dx must be dy itself (in place) or a tensor of its own, not x or part of dy, got x ",
            describe(x), ", dy ", describe(dy), ", dx ", describe(dx));
  }
  for (const Tensor* t : {&mean, &invstd}) require_f32(op, "mean and invstd", *t, d.channels);
  if (dgamma.defined())
    for (const Tensor* t : {&dgamma, &dbeta}) require_f32(op, "dgamma and dbeta", *t, d.channels);
  if (bn.grad_sums) require_grad_sums(op, "grad_sums", *bn.grad_sums, d.channels);
  if (bn.dx_sums) {
    require(dx.defined(), op, "dx_sums (the sum of dx per channel) needs dx");
    require_f32(op, "dx_sums (the sum of dx per channel)", *bn.dx_sums, d.channels);
  }
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
  require_pooled_map(op, "y", y, d, "f32/f16/bf16", is_floating);
  require(y.dtype() == x.dtype(), op, "expects y of x's dtype, got x ", describe(x), ", y ",
          describe(y));
  if (argmax.defined()) require_pooled_map(op, "argmax", argmax, d, "i32", is_i32);
  return d;
}

MaxPoolDims require_maxpool2d_backward(const Tensor& dy, const Tensor& argmax, const Tensor& dx,
                                       const MaxPoolParams& pool) {
  const char* op = "maxpool2d_backward";
  const MaxPoolDims d = maxpool2d_dims(op, "dx", dx, pool);
  require_pooled_map(op, "dy", dy, d, "f32/f16/bf16", is_floating);
  require_pooled_map(op, "argmax", argmax, d, "i32", is_i32);
  return d;
}

namespace {

// Checks logits [N, K] (floating) and labels i32 [N]; returns N and K.
LogitDims logits_and_labels(const char* op, const Tensor& logits, const Tensor& labels) {
  require_floating(op, "logits", logits);
  require(logits.shape().rank() == 2, op, "expects logits [N, K], got ", describe(logits));
  const LogitDims d{logits.shape()[0], logits.shape()[1]};
  require(labels.defined() && labels.dtype() == DType::i32 && labels.numel() == d.rows, op,
          "expects labels i32 [", d.rows, "] for logits ", describe(logits), ", got ",
          describe(labels));
  return d;
}

} // namespace

void require_mse_forward(const Tensor& pred, const Tensor& target, const Tensor& loss) {
  const char* op = "mse_forward";
  require_floating(op, "pred", pred);
  require_floating(op, "target", target);
  require_same_numel(op, "pred", pred, "target", target);
  require_f32(op, "loss", loss, 1);
}

void require_mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss,
                          const Tensor& dpred) {
  const char* op = "mse_backward";
  require_floating(op, "pred", pred);
  require_floating(op, "target", target);
  require_floating(op, "dpred", dpred);
  require_same_numel(op, "pred", pred, "target", target);
  require_same_numel(op, "pred", pred, "dpred", dpred);
  require_f32(op, "dloss", dloss, 1);
}

LogitDims require_cross_entropy_forward(const Tensor& logits, const Tensor& labels,
                                        const Tensor& loss) {
  const char* op = "cross_entropy_forward";
  const LogitDims d = logits_and_labels(op, logits, labels);
  require_f32(op, "loss", loss, 1);
  return d;
}

LogitDims require_cross_entropy_backward(const Tensor& logits, const Tensor& labels,
                                         const Tensor& dloss, const Tensor& dlogits) {
  const char* op = "cross_entropy_backward";
  const LogitDims d = logits_and_labels(op, logits, labels);
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

void require_sum_squares(const Tensor& x, const Tensor& sum_sq) {
  require_floating("sum_squares", "x", x);
  require_f32("sum_squares", "sum_sq", sum_sq, 1);
}

void require_clip_coefficient(const Tensor& sum_sq, const Tensor& coef) {
  require_f32("clip_coefficient", "sum_sq", sum_sq, 1);
  require_f32("clip_coefficient", "coef", coef, 1);
}

namespace {

// Unless every gradient is a defined f32 tensor.
void require_f32_gradients(const char* op, const std::vector<Tensor*>& grads) {
  for (const Tensor* grad : grads)
    require(grad && grad->defined() && grad->dtype() == DType::f32, op,
            "gradients must be defined f32 tensors, got ", describe(grad));
}

} // namespace

void require_amp_unscale(const std::vector<Tensor*>& grads, const Tensor& scale,
                         const Tensor& found_inf) {
  require_f32("amp_unscale", "scale", scale, 1);
  require_f32("amp_unscale", "found_inf", found_inf, 1);
  require_f32_gradients("amp_unscale", grads);
}

void require_amp_update_scale(const Tensor& scale, const Tensor& growth_tracker,
                              const Tensor& found_inf) {
  const char* op = "amp_update_scale";
  require_f32(op, "scale", scale, 1);
  require_f32(op, "found_inf", found_inf, 1);
  require(growth_tracker.defined() && growth_tracker.dtype() == DType::i32 &&
              growth_tracker.numel() == 1,
          op, "growth_tracker must be i32 with 1 element, got ", describe(growth_tracker));
}

void require_range_counts(const Tensor& x, DType format, const Tensor& counts) {
  require_floating("range_counts", "x", x);
  require(is_half_precision(format), "range_counts", "the format must be f16 or bf16, got ",
          format);
  require_f32("range_counts", "counts", counts, 5);
}

void require_zero_grads(const std::vector<Tensor*>& grads) {
  require_f32_gradients("zero_grads", grads);
}

namespace {

// Unless the slot has master and grad f32 of one size, and an f16 or bf16 copy of that size when
// it has one.
void require_param_slot(const char* op, const ParamSlot& slot) {
  require(slot.master && slot.master->defined(), op, "every parameter needs a master tensor");
  const int64_t n = slot.master->numel();
  require_f32(op, "master", *slot.master, n);
  require(slot.grad != nullptr, op, "parameter ", describe(*slot.master), " has no gradient");
  require_f32(op, "grad", *slot.grad, n);
  if (slot.half && slot.half->defined())
    require(is_half_precision(slot.half->dtype()) && slot.half->numel() == n, op,
            "the working copy of ", describe(*slot.master),
            " must be f16 or bf16 of the same size, got ", describe(*slot.half));
}

// Unless the optimizer state `name` of the slot is f32 of the master's size.
void require_state(const char* op, const char* name, const Tensor* state, const ParamSlot& slot) {
  require(state != nullptr, op, "parameter ", describe(*slot.master), " has no ", name);
  require_f32(op, name, *state, slot.master->numel());
}

void require_found_inf(const char* op, const Tensor& found_inf) {
  if (found_inf.defined()) require_f32(op, "found_inf", found_inf, 1);
}

} // namespace

void require_sgd_step(const std::vector<ParamSlot>& params, const SgdParams& sgd,
                      const Tensor& found_inf) {
  const char* op = "sgd_step";
  require_found_inf(op, found_inf);
  for (const ParamSlot& slot : params) {
    require_param_slot(op, slot);
    if (sgd.momentum != 0.0f) require_state(op, "momentum_buffer", slot.momentum_buffer, slot);
  }
}

void require_adam_step(const std::vector<ParamSlot>& params, const Tensor& step,
                       const Tensor& found_inf) {
  const char* op = "adam_step";
  require_f32(op, "step", step, 1);
  require_found_inf(op, found_inf);
  for (const ParamSlot& slot : params) {
    require_param_slot(op, slot);
    require_state(op, "exp_avg", slot.exp_avg, slot);
    require_state(op, "exp_avg_sq", slot.exp_avg_sq, slot);
  }
}

} // namespace minamp
