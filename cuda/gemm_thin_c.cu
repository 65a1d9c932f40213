// GEMMs whose C has at most kThinN rows or columns, summed over a long K, on CUDA cores: A
// transposed and B untransposed, both stored [K, .], as in the weight gradient dw = dy^T @ x of a
// 1x1 conv with few output channels (sine's last conv: dw [1, 256]) or few input channels (its
// first: dw [256, 2]), K = every pixel of the batch. A tensor-core tile pads the thin side of C to
// 64 and splits K into slices: for what is one pass over a [K, 256] matrix, that took 137 and
// 146 µs on an H200 (128 MiB read: ~30 µs), and the last conv's x was batch-normalised and written
// out first.
//
// Such a GEMM is a column reduction. Of its two stored matrices, the wide one W [K, Cw] holds the
// long side of C and the thin one T [K, t] (t <= kThinN) the other:
//   out[j, c] = sum over k of T[k, j] * W[k, c],   C[j, c] (T is A) or C[c, j] (T is B).
// A thread keeps the same kPack consecutive columns of W in every step (their batch norm
// parameters read once when W is read through a batch norm, WideKind), walks the rows of its
// block's slice of K with kRowsInFlight rows' loads in flight, and sums its t x kPack products in
// fp32 (explicit fmaf, so that W read through a batch norm and the same values written out sum
// alike wherever this is compiled). W may be a normalised operand (gemm.cuh's
// GemmOperand::normalization: the last conv's pre-batch-norm x, each value normalised as it loads)
// or a batch norm's input gradient (GemmOperand::input_grad: the first conv's output gradient,
// each value computed from the batch norm's output gradient and x as they load, and also summed
// per column: the conv's bias gradient); either way rounded to W's dtype, what the batch norm
// kernel would have stored. The block adds its threads' sums per column in thread order into
// partials [row blocks, t (+ 1 for those sums), Cw]; a second kernel adds the row blocks of each
// element of C in block order (a warp per element: each lane a fixed run of blocks, then a fixed
// shuffle tree) and applies the epilogue. Deterministic: no atomics.
#include <algorithm>
#include <type_traits>

#include "channel_packs.cuh"
#include "device.cuh"
#include "gemm.cuh"
#include "reduce.cuh"

namespace minamp::gpu {

namespace {

constexpr int kThreads = 256;
// Rows whose loads a thread has in flight: 8, or 4 when it reads a batch norm's input gradient
// (two packs a row, and the batch norm's 7 vectors: 8 rows spilled at 128 registers).
template <bool kInputGrad> constexpr int kRowsInFlight = kInputGrad ? 4 : 8;
// The rows each thread walks at least, where there are that many.
constexpr int64_t kMinRowsPerThread = 16;

// How the partials kernel reads W: as stored, batch-normalised (W is a batch norm's input x), or
// as a batch norm's input gradient (W is the gradient of its output, read beside its x).
enum class WideKind { plain, normalized, batchnorm_input_grad };

// The blocks per SM a launch of the partials kernel aims at, which its launch bounds hold ptxas
// to: 4 (64 registers) for one thin column, 2 (128) for several (the 8 rows' 4 thin values and
// the 16 sums spilled at 64), for a normalised f32 W (8 rows of 4 floats beside the 16
// parameters spilled too) and for a batch norm's input gradient (two packs a row, 7 vectors).
// Either way a block has 8 rows of 8 or 16 bytes a thread in flight (4 rows of two packs of 8 or
// 16 for a batch norm's input gradient). Without the bounds ptxas compiled the kernels for 32
// registers, issuing each row's loads only after the row before had arrived.
constexpr int thin_c_blocks_per_sm(int thin_cols, WideKind wide, int element_bytes) {
  const bool light = wide == WideKind::plain || (wide == WideKind::normalized && element_bytes < 4);
  return thin_cols == 1 && light ? 4 : 2;
}

// How a launch covers W [rows, wide_cols] in packs of kPack columns: `block_groups` packs of a row
// per block (all of them, or kThreads at a time in `column_blocks` along gridDim.y), `lane_rows`
// rows a step (kThreads / block_groups; the threads past lane_rows * block_groups idle),
// `tile_rows` rows per block in `row_blocks` along gridDim.x.
struct ThinCShape {
  int64_t rows = 0, tile_rows = 0;
  int wide_cols = 0, thin_cols = 0;
  int block_groups = 0, lane_rows = 0;
  int row_blocks = 0, column_blocks = 0;
};

// kPack stored values of W, held as stored until used (see load_wide).
template <int kPack, class T> using WidePack = std::conditional_t<kPack == 4, Stored4<T>, T>;

// W[row, col .. col + kPack) as stored: one 8- or 16-byte load for a pack of 4.
template <int kPack, class T>
__device__ __forceinline__ WidePack<kPack, T> load_wide(const T* w, int64_t at) {
  if constexpr (kPack == 4)
    return load4_stored(w, at);
  else
    return w[at];
}

template <int kPack, class T>
__device__ __forceinline__ void widen_wide(const WidePack<kPack, T>& stored, float (&v)[kPack]) {
  if constexpr (kPack == 4) {
    const Float4 f = widen4<T>(stored);
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = f.v[e];
  } else {
    v[0] = load_f(&stored, 0);
  }
}

// T[row, j] as stored for j < kThinCols: the last of the row's thin_cols values again past them
// (no load under a condition of its own: such a load is converted as it arrives, and the next one
// issued only then; the products of those are never stored).
template <int kThinCols, class T>
__device__ __forceinline__ void load_thin(const T* t, int thin_cols, int64_t row,
                                          T (&values)[kThinCols]) {
#pragma unroll
  for (int j = 0; j < kThinCols; ++j) values[j] = t[row * thin_cols + min(j, thin_cols - 1)];
}

// What a thread of the partials kernel keeps of its kPack columns when W is read through a batch
// norm: the batch norm's vectors (normalised W) and its gradient sums and factors (W a batch norm's
// input gradient); nothing for a plain W.
template <WideKind kWide, int kPack>
using WideChannels = std::conditional_t<kWide == WideKind::batchnorm_input_grad, DxChannels<kPack>,
                                        ChannelValues<kPack>>;

// The sums a thread of the partials kernel keeps per column: one per thin column, and for a batch
// norm's input gradient the sum of W' itself (a bias gradient).
template <WideKind kWide, int kThinCols>
constexpr int kWideSums = kThinCols + (kWide == WideKind::batchnorm_input_grad ? 1 : 0);

// partials[blockIdx.x, j, c] = the sum over the block's rows of T[row, j] * W'[row, c] for its
// columns c (W' = W, or W read through a batch norm per kWide), j < s.thin_cols; for a batch
// norm's input gradient also partials[blockIdx.x, s.thin_cols, c] = the sum of W'[row, c].
// kThinCols is t for t = 1 or 2 (sine's last and first convs), else kThinN (a t of 3 loads each
// row's last thin value once more, its products never stored).
template <int kPack, int kThinCols, WideKind kWide, class T>
__global__ void __launch_bounds__(kThreads, thin_c_blocks_per_sm(kThinCols, kWide, int(sizeof(T))))
    thin_c_partials_kernel(const T* __restrict__ w, BatchNormChannels nz,
                           BatchNormInputGradView grad, const T* __restrict__ t, ThinCShape s,
                           float* __restrict__ partials) {
  constexpr bool kInputGrad = kWide == WideKind::batchnorm_input_grad;
  constexpr int kSums = kWideSums<kWide, kThinCols>;
  const int local = int(threadIdx.x) % s.block_groups, lane = int(threadIdx.x) / s.block_groups;
  const int col = (int(blockIdx.y) * s.block_groups + local) * kPack;
  const bool active = lane < s.lane_rows && col < s.wide_cols;
  const int64_t row_begin = int64_t(blockIdx.x) * s.tile_rows;
  const int64_t row_end = active ? min(s.rows, row_begin + s.tile_rows) : row_begin;
  const float n = float(s.rows); // the batch norm's values per channel
  // The batch norm's values of the thread's columns, when it has any.
  WideChannels<kWide, kPack> ch;
  if constexpr (kWide == WideKind::normalized)
    if (active) ch = ChannelValues<kPack>(nz, col);
  if constexpr (kInputGrad)
    if (active) ch = DxChannels<kPack>(nz, grad.grad_sums, s.wide_cols, col, n, grad.training);
  const T* x = static_cast<const T*>(grad.x); // the batch norm's input, beside its gradient W
  constexpr int kRows = kRowsInFlight<kInputGrad>;
  float sums[kSums][kPack] = {};
  WidePack<kPack, T> wide[kRows], wide_x[kInputGrad ? kRows : 1];
  T thin[kRows][kThinCols];
  for_each_batched<kRows>(
      row_begin + lane, s.lane_rows, row_end,
      [&](int r, int64_t row) {
        wide[r] = load_wide<kPack>(w, row * s.wide_cols + col);
        if constexpr (kInputGrad) wide_x[r] = load_wide<kPack>(x, row * s.wide_cols + col);
        load_thin(t, s.thin_cols, row, thin[r]);
      },
      [&](int r, int64_t) {
        float v[kPack];
        widen_wide<kPack, T>(wide[r], v);
        if constexpr (kWide == WideKind::normalized)
#pragma unroll
          for (int e = 0; e < kPack; ++e)
            v[e] = as_stored<T>(batchnorm_normalized(v[e], ch.gamma[e], ch.beta[e], ch.mean[e],
                                                     ch.invstd[e], nz.relu));
        if constexpr (kInputGrad) {
          float xv[kPack];
          widen_wide<kPack, T>(wide_x[r], xv);
#pragma unroll
          for (int e = 0; e < kPack; ++e) {
            v[e] = as_stored<T>(ch.dx(xv[e], v[e], e, n, nz.relu, grad.training));
            sums[kThinCols][e] += v[e];
          }
        }
#pragma unroll
        for (int j = 0; j < kThinCols; ++j) {
          const float factor = load_f(thin[r], j);
#pragma unroll
          for (int e = 0; e < kPack; ++e) sums[j][e] = fmaf(factor, v[e], sums[j][e]);
        }
      });

  // The block's columns' sums, its lanes added in lane order: staged [lane][j][block column].
  __shared__ float staged[kThreads * kSums * kPack];
  const int width = s.block_groups * kPack;
  if (lane < s.lane_rows)
#pragma unroll
    for (int j = 0; j < kSums; ++j)
#pragma unroll
      for (int e = 0; e < kPack; ++e)
        staged[(lane * kSums + j) * width + local * kPack + e] = sums[j][e];
  __syncthreads();
  const int first_col = int(blockIdx.y) * width;
  const int partial_rows = s.thin_cols + (kInputGrad ? 1 : 0);
  for (int i = threadIdx.x; i < kSums * width; i += kThreads) {
    const int j = i / width, block_col = i % width, c = first_col + block_col;
    const bool wide_sum = kInputGrad && j == kThinCols; // W' itself
    if ((j >= s.thin_cols && !wide_sum) || c >= s.wide_cols) continue;
    float total = 0.0f;
    for (int l = 0; l < s.lane_rows; ++l) total += staged[(l * kSums + j) * width + block_col];
    const int row = wide_sum ? s.thin_cols : j;
    partials[(int64_t(blockIdx.x) * partial_rows + row) * s.wide_cols + c] = total;
  }
}

// C = epilogue(out) from partials [row_blocks, partial_rows, wide_cols]: one warp per element of
// out, lane l adding row blocks l, l + 32, ... in order, the lanes then added by warp_sum's fixed
// tree. out[j, c] is C[j, c] when T is A (C [thin_cols, wide_cols]), else C[c, j]; with bias_grad
// (f32 [wide_cols]), partial row thin_cols (the sums of W') is added to it the same way.
template <class CT>
__global__ void __launch_bounds__(kThreads)
    thin_c_finish_kernel(const float* __restrict__ partials, int row_blocks, int partial_rows,
                         int thin_cols, int wide_cols, bool thin_is_a, CT* c, EpilogueArgs ep,
                         float* __restrict__ bias_grad) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  const int64_t stride = int64_t(partial_rows) * wide_cols;
  const int64_t outputs = int64_t(thin_cols + (bias_grad ? 1 : 0)) * wide_cols;
  for (int64_t o = (blockIdx.x * int64_t(kThreads) + threadIdx.x) / 32; o < outputs; o += warps) {
    float acc = 0.0f;
    for (int b = lane; b < row_blocks; b += 32) acc += partials[int64_t(b) * stride + o];
    acc = warp_sum(acc);
    if (lane != 0) continue;
    const int j = int(o / wide_cols), col = int(o % wide_cols);
    if (j == thin_cols)
      bias_grad[col] += acc;
    else if (thin_is_a)
      store_output(c, wide_cols, j, col, acc, ep);
    else
      store_output(c, thin_cols, col, j, acc, ep);
  }
}

// The launch shape for W [rows, wide_cols] in packs of `pack` (rows, wide_cols > 0): about
// blocks_per_sm blocks per SM, each thread walking at least kMinRowsPerThread rows where there are
// that many.
ThinCShape thin_c_shape(int64_t rows, int wide_cols, int thin_cols, int pack, int blocks_per_sm) {
  ThinCShape s;
  s.rows = rows, s.wide_cols = wide_cols, s.thin_cols = thin_cols;
  const int groups = (wide_cols + pack - 1) / pack;
  s.block_groups = std::min(groups, kThreads);
  s.lane_rows = kThreads / s.block_groups;
  s.column_blocks = (groups + s.block_groups - 1) / s.block_groups;
  const int64_t wanted =
      (int64_t(blocks_per_sm) * sm_count() + s.column_blocks - 1) / s.column_blocks;
  const int64_t most = std::max<int64_t>(1, rows / (kMinRowsPerThread * s.lane_rows));
  const int64_t row_blocks = std::min(wanted, most);
  const int64_t tile_rows = (rows + row_blocks - 1) / row_blocks;
  s.tile_rows = (tile_rows + s.lane_rows - 1) / s.lane_rows * s.lane_rows;
  s.row_blocks = int((rows + s.tile_rows - 1) / s.tile_rows);
  return s;
}

// How the wide operand of a thin-C GEMM is read.
WideKind wide_kind(const GemmOperand& wide) {
  if (wide.kind == OperandKind::normalized) return WideKind::normalized;
  if (wide.kind == OperandKind::batchnorm_input_grad) return WideKind::batchnorm_input_grad;
  return WideKind::plain;
}

template <class T, class CT> void launch(const GemmArgs& args) {
  const bool thin_is_a = args.m <= kThinN;
  const GemmOperand& wide_op = thin_is_a ? args.b : args.a;
  const GemmOperand& thin_op = thin_is_a ? args.a : args.b;
  const T* w = static_cast<const T*>(wide_op.data);
  const T* t = static_cast<const T*>(thin_op.data);
  const WideKind wide = wide_kind(wide_op);
  const int wide_cols = int(thin_is_a ? args.n : args.m),
            thin_cols = int(thin_is_a ? args.m : args.n);
  // Packs of 4 where every vector the kernel reads in packs is aligned for them.
  const BatchNormInputGradView& grad = wide_op.input_grad;
  const bool aligned = aligned_for_pack(w) && (wide != WideKind::batchnorm_input_grad ||
                                               (aligned_for_pack(static_cast<const T*>(grad.x)) &&
                                                aligned_for_pack(grad.grad_sums) &&
                                                aligned_for_pack(grad.grad_sums + wide_cols) &&
                                                aligned_for_pack(wide_op.normalization.gamma) &&
                                                aligned_for_pack(wide_op.normalization.beta) &&
                                                aligned_for_pack(wide_op.normalization.mean) &&
                                                aligned_for_pack(wide_op.normalization.invstd)));
  const int pack = pack_width(wide_cols, aligned);
  const int thin_template = thin_cols <= 2 ? thin_cols : int(kThinN); // the kernel's kThinCols
  const ThinCShape s = thin_c_shape(args.k, wide_cols, thin_cols, pack,
                                    thin_c_blocks_per_sm(thin_template, wide, int(sizeof(T))));
  const int partial_rows = thin_cols + (wide == WideKind::batchnorm_input_grad ? 1 : 0);
  Tensor partials =
      Tensor::empty({s.row_blocks, partial_rows, wide_cols}, DType::f32, Device::cuda);
  const auto run = [&](auto pack_constant, auto thin_constant, auto wide_constant) {
    constexpr int kPack = decltype(pack_constant)::value;
    constexpr int kThinCols = decltype(thin_constant)::value;
    constexpr WideKind kWide = decltype(wide_constant)::value;
    thin_c_partials_kernel<kPack, kThinCols, kWide, T>
        <<<dim3(s.row_blocks, s.column_blocks), kThreads, 0, stream()>>>(
            w, wide_op.normalization, grad, t, s, ptr<float>(partials));
  };
  const auto on_thin = [&](auto pack_constant, auto wide_constant) {
    if (thin_template == 1)
      run(pack_constant, std::integral_constant<int, 1>{}, wide_constant);
    else if (thin_template == 2)
      run(pack_constant, std::integral_constant<int, 2>{}, wide_constant);
    else
      run(pack_constant, std::integral_constant<int, int(kThinN)>{}, wide_constant);
  };
  const auto on_pack = [&](auto wide_constant) {
    if (pack == 4)
      on_thin(std::integral_constant<int, 4>{}, wide_constant);
    else
      on_thin(std::integral_constant<int, 1>{}, wide_constant);
  };
  using Kind = WideKind;
  if (wide == Kind::normalized)
    on_pack(std::integral_constant<Kind, Kind::normalized>{});
  else if (wide == Kind::batchnorm_input_grad)
    on_pack(std::integral_constant<Kind, Kind::batchnorm_input_grad>{});
  else
    on_pack(std::integral_constant<Kind, Kind::plain>{});
  CUDA_CHECK_LAUNCH("gemm (thin C, CUDA cores)");
  const int64_t outputs = int64_t(partial_rows) * wide_cols;
  thin_c_finish_kernel<<<grid_for(outputs * 32, kThreads), kThreads, 0, stream()>>>(
      ptr<float>(partials), s.row_blocks, partial_rows, thin_cols, wide_cols, thin_is_a,
      static_cast<CT*>(args.c), args.epilogue, args.bias_grad);
  CUDA_CHECK_LAUNCH("gemm (thin C, CUDA cores): adding the row blocks");
}

} // namespace

void thin_c_gemm(const GemmArgs& args) {
  if (args.m == 0 || args.n == 0) return;
  const auto launch_for = [&](auto operands) {
    using T = typename decltype(operands)::type;
    visit_output<T>(args, [&](auto output) { launch<T, typename decltype(output)::type>(args); });
  };
  if (args.ab_dtype == DType::f32)
    launch_for(TypeTag<float>{});
  else
    visit_half_precision(args.ab_dtype, "gemm", launch_for);
  column_statistics_of_output(args);
}

} // namespace minamp::gpu
