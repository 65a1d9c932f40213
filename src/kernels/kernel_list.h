// The kernel interface: one declaration per op, included (on purpose without an include guard)
// into three namespaces by kernels.h — minamp::kernels (the dispatcher), minamp::cpu (the Eigen
// reference) and minamp::gpu (the CUDA backend) — so the three always agree.
//
// Conventions: tensors are contiguous and row-major; a tensor of rank > 2 passed where a matrix
// is expected is viewed as [rows, last]. Floating inputs may be f32, f16 or bf16; math is fp32 and
// an f16 or bf16 output is rounded to nearest even. "+=" marks outputs that accumulate (weight
// gradients); every other output is overwritten. Backward kernels write fresh gradients.

// dst = value everywhere (any dtype).
void fill(Tensor& dst, float value);
// dst = src converted to dst's dtype (same shape; into f16 or bf16 rounds to nearest even).
void cast(const Tensor& src, Tensor& dst);
// dst += alpha * src (same numel; math in fp32, result rounded to dst's dtype).
void add_inplace(Tensor& dst, const Tensor& src, float alpha);
// dst = src * scale[0], scale a one-element f32 tensor read where it lives (no host read);
// dst may be src.
void mul_scalar(const Tensor& src, const Tensor& scale, Tensor& dst);

// C[M, N] = alpha * op(A) @ op(B) + beta * C, then + bias[N], then ReLU, per `epilogue`.
// op(A) is [M, K] (A is [K, M] when trans_a); op(B) is [K, N] (B is [N, K] when trans_b).
// A and B share a dtype (f32, f16 or bf16); C is f32 or A's dtype (or any floating dtype for f32
// A and B); bias is f32. Accumulation is fp32.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
          const GemmEpilogue& epilogue);
// db[N] += sum over rows of dy[rows, N] (db f32).
void bias_backward(const Tensor& dy, Tensor& db);

// y = a + b, then ReLU when `relu` (same numel; floating dtypes, any mix; math in fp32, rounded
// to y's dtype). The gradient is dy for both inputs (through relu_backward on y when fused).
void add_forward(const Tensor& a, const Tensor& b, Tensor& y, bool relu);

// y = max(x, 0), any floating dtype, y.dtype == x.dtype.
void relu_forward(const Tensor& x, Tensor& y);
// dx = 0 where y <= 0, else dy (y is the forward output; a NaN y passes its gradient, as
// PyTorch's threshold_backward).
void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx);

// y[N, Ho, Wo, Cout] = conv(x[N, H, W, Cin], w[Cout, kh, kw, Cin]) (+ bias, ReLU per epilogue;
// alpha/beta are not used). Ho = (H + 2 pad - kh) / stride + 1, likewise Wo. With input_norm, the
// conv's input is x batch-normalised as input_norm says, applied as x is loaded; only where
// conv2d_normalizes_on_load allows it (an Error elsewhere).
void conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvParams& conv,
                    const GemmEpilogue& epilogue, const InputNormalization* input_norm = nullptr);
// dx[N, H, W, Cin] = input gradient (when dx is defined); dw[Cout, kh, kw, Cin] += weight
// gradient in f32 (when dw is defined). With input_norm (as in the forward), dw is computed from
// the normalised input, and dx is the gradient with respect to it (the batch norm's output);
// input_norm's grad_sums, when given, also gets the sums the batch norm's backward needs from dx.
void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                     const ConvParams& conv, const InputNormalization* input_norm = nullptr);
// Whether conv2d_forward and conv2d_backward take an input_norm for these tensors: a 1x1,
// stride-1, unpadded conv with x and w in one dtype, on CUDA, whose GEMMs run on a kernel that
// normalises its operand as it loads it. Never on the CPU, whose unfused batch norm is the
// reference.
bool conv2d_normalizes_on_load(const Tensor& x, const Tensor& w, const ConvParams& conv);
// The parameter gradients of a conv whose output gradient is the input gradient of the batch norm
// after it, given as that batch norm's terms (`grad`, whose x is the conv's output) rather than
// written: dw[Cout, kh, kw, Cin] += the weight gradient and db[Cout] += the bias gradient (f32;
// either may be undefined), the output gradient being the dx batchnorm_backward would write (in
// grad.x's dtype). Each element of it is computed as the weight gradient reads it, and none is
// stored; only where conv2d_reads_batchnorm_input_grad allows it (an Error elsewhere).
void conv2d_backward_from_batchnorm(const Tensor& x, const Tensor& w,
                                    const BatchNormInputGrad& grad, Tensor& dw, Tensor& db,
                                    const ConvParams& conv);
// Whether conv2d_backward_from_batchnorm takes these tensors: on CUDA, a 1x1, stride-1, unpadded
// conv with few input channels over many pixels (its weight gradient a thin-C GEMM, A the wide
// operand), x, w and the batch norm's x and dy in one dtype. Never on the CPU, where the batch
// norm writes its input gradient (the reference).
bool conv2d_reads_batchnorm_input_grad(const Tensor& x, const Tensor& w,
                                       const BatchNormInputGrad& grad, const ConvParams& conv);

// Batch norm over x[rows, C] (an NHWC activation viewed as [N*H*W, C]); gamma, beta f32 [C].
// Training: batch mean and biased variance, saved as mean[C] and invstd[C] = 1/sqrt(var + eps),
// and running_mean/var (f32 [C]) updated with `momentum` and the unbiased variance.
// Eval: normalise with the running statistics (mean/invstd are still written, from them).
// y = gamma * (x - mean) * invstd + beta, then ReLU when bn.relu; y.dtype == x.dtype; y must not
// be x (an Error: the GPU kernel reads x through a non-aliasing pointer). With y undefined, only
// the statistics (mean, invstd, the running statistics' update): for a conv2d_forward that
// applies the normalisation itself (InputNormalization).
void batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                       Tensor& mean, Tensor& invstd, Tensor& running_mean, Tensor& running_var,
                       const BatchNormParams& bn);
// dx (x's dtype), dgamma += , dbeta += (f32), from the saved mean/invstd. With bn.relu, the
// ReLU mask is recomputed from x. In training mode dx includes the terms through the batch
// statistics; in eval mode the statistics are constants. dx may be dy itself, in place (each
// dx element needs only its own dy and x, and the sums over dy are taken first); dx must not be x
// or overlap either otherwise (an Error). dx, or dgamma and dbeta, may be undefined: that part
// is not computed.
void batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                        const Tensor& mean, const Tensor& invstd, const Tensor& dy, Tensor& dx,
                        Tensor& dgamma, Tensor& dbeta, const BatchNormParams& bn);

// y[N, C] = mean over H, W of x[N, H, W, C]; y.dtype == x.dtype.
void avgpool_forward(const Tensor& x, Tensor& y);
// dx[N, H, W, C] = dy[N, C] / (H * W).
void avgpool_backward(const Tensor& dy, Tensor& dx);

// y[N, Ho, Wo, C] = the largest value of x[N, H, W, C] in each kernel x kernel window (padding
// never wins), Ho = (H + 2 pad - kernel) / stride + 1 rounded down, likewise Wo; y.dtype ==
// x.dtype. argmax i32 [N, Ho, Wo, C] (written when defined) = ih * W + iw of the value taken: the
// first largest in row-major window order, or the last NaN (PyTorch's max_pool2d).
void maxpool2d_forward(const Tensor& x, Tensor& y, Tensor& argmax, const MaxPoolParams& pool);
// dx[N, H, W, C] = the sum of dy[N, Ho, Wo, C] over the outputs whose argmax is that pixel, in
// output order (a gather: no atomics, the same sum on every backend).
void maxpool2d_backward(const Tensor& dy, const Tensor& argmax, Tensor& dx,
                        const MaxPoolParams& pool);

// loss[1] (f32) = mean((pred - target)^2), math in fp32.
void mse_forward(const Tensor& pred, const Tensor& target, Tensor& loss);
// dpred = dloss[0] * 2 (pred - target) / numel, in pred's dtype.
void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dpred);

// loss[1] (f32) = mean over rows of -log softmax(logits[N, K])[label], log-sum-exp in fp32;
// labels i32 [N] in [0, K).
void cross_entropy_forward(const Tensor& logits, const Tensor& labels, Tensor& loss);
// dlogits = dloss[0] * (softmax(logits) - onehot(labels)) / N, in logits' dtype.
void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& dloss,
                            Tensor& dlogits);

// sum_sq[0] (f32) += sum of x^2 (for gradient norms), fp32 accumulation.
void sum_squares(const Tensor& x, Tensor& sum_sq);
// coef[0] = min(1, max_norm / (sqrt(sum_sq[0]) + 1e-6)), as torch.nn.utils.clip_grad_norm_.
void clip_coefficient(const Tensor& sum_sq, float max_norm, Tensor& coef);

// PyTorch's _amp_foreach_non_finite_check_and_unscale_: for every gradient, g *= 1 / scale[0]
// (the reciprocal taken in double and rounded to float, as GradScaler.unscale_), and found_inf[0]
// = 1 if the unscaled g is inf or NaN (never reset here). PyTorch checks the scaled g instead;
// the two agree unless unscaling overflows (a scale below 1, or one whose reciprocal is inf), where
// PyTorch would apply an inf and this skips the step: a deliberate difference
// (docs/mixed-precision.md). scale and found_inf are f32 [1] on the gradients' device.
void amp_unscale(const std::vector<Tensor*>& grads, const Tensor& scale, Tensor& found_inf);
// PyTorch's _amp_update_scale_: on found_inf, scale *= backoff and tracker = 0; otherwise
// ++tracker, and when it reaches interval, scale *= growth (if still finite) and tracker = 0.
// scale f32 [1], growth_tracker i32 [1], found_inf f32 [1].
void amp_update_scale(Tensor& scale, Tensor& growth_tracker, const Tensor& found_inf,
                      const ScalerParams& scaler);

// Every gradient (f32, one device) set to zero: zero_grad in one pass over all of them (on the
// GPU one launch per 240 chunks of 32768 values, whatever the number of tensors).
void zero_grads(const std::vector<Tensor*>& grads);
// One SGD step over every parameter, skipped entirely when found_inf (may be undefined) is
// nonzero. PyTorch semantics (dampening 0): g' = g + wd * w; with momentum, buf = m * buf + g'
// (buf starts at zero, so the first step's buf is g' as in PyTorch) and w -= lr * buf; without,
// w -= lr * g'. Writes the f16 or bf16 copy when it is defined.
void sgd_step(const std::vector<ParamSlot>& params, const SgdParams& sgd, const Tensor& found_inf);
// One Adam step (PyTorch semantics, bias-corrected) over every parameter; `step` is an f32 [1]
// tensor incremented by the kernel unless skipped. Skipped entirely when found_inf is nonzero.
void adam_step(const std::vector<ParamSlot>& params, const AdamParams& adam, Tensor& step,
               const Tensor& found_inf);

// counts[0..4] (f32 [5], +=) over the finite values v of x, with s = v * scale rounded to
// `format` (f16 or bf16): [0] v != 0 but s flushes to zero, [1] s is subnormal (0 < |s| <
// 2^-14 in f16, 2^-126 in bf16), [2] s overflows to inf, [3] v != 0 (the total); and [4] the
// number of values of x that are inf or NaN.
void range_counts(const Tensor& x, float scale, DType format, Tensor& counts);
