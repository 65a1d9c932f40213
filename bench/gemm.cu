// bench_gemm: TFLOP/s of minamp's GEMMs beside cuBLAS in the same process — the tensor-core GEMM
// (f16 in, fp32 accumulate) against cublasGemmEx (f16 in, CUBLAS_COMPUTE_32F), as the library
// runs it and then each version of its ladder (cuda/gemm_v1_naive.cu ... gemm_v5_multistage.cu)
// forced, and the fp32 SIMT GEMM against cublasSgemm — on square shapes, on the GEMMs of the sine
// model and of the classify benchmark, on ResNet-50's convolution GEMMs, and on sine's forward
// GEMM at growing K with and without the batch norm hooks of a fused layer (the statistics
// epilogue, the normalised operand; --shapes depth). Before timing, every result
// is compared with cuBLAS's over the whole matrix, and a few entries of both with an fp64 sum on
// the host. Times come from CUDA events on minamp's stream (cuBLAS runs on it too): warm-up, then
// the median of many runs, the two libraries interleaved in rounds, inputs rotated over enough
// buffers to leave the L2 cold when one set would fit in it; a short spin kernel ahead of each
// timed series keeps the host's launch rate out of the times. The JSON also records minamp's peak
// device bytes and device memory's copy rate (the byte rate of bench/report.py's step floor). With
// --sweep, other configurations of v4 and v5 than the library's (tile shapes, and v5's large tile
// on a persistent grid) are checked and timed the same way on the shapes that matter most (tuning
// data: which configuration the library should use). --kernels prints, without a GPU, which kernel
// each version runs at 4096^3 (for bench/gemm_sass.py).
#include <CLI/CLI.hpp>
#include <cublas_v2.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "cli.h"
#include "common.cuh"
#include "core/rng.h"
#include "gemm.cuh"
#include "io/atomic_file.h"
#include "kernels/gemm_version.h"
#include "kernels/kernels.h"

using namespace minamp;
using json = nlohmann::json;

namespace {

// C[M, N] = op(A) @ op(B); A is stored [K, M] when ta, B is stored [N, K] when tb.
struct GemmShape {
  std::string name;
  int64_t m, n, k;
  bool ta = false, tb = false;
  DType c16 = DType::f16; // C's dtype in the f16 runs (f32 runs always write f32)
  bool sweep = false;     // --sweep times the other v4 and v5 configurations on it too
  bool hooks = false;     // f16 only: also timed with the batch norm hooks of a fused layer
};

std::vector<GemmShape> all_shapes(const std::string& which) {
  std::vector<GemmShape> shapes;
  if (which == "tiny") { // a quick check of the whole benchmark path (the tests run it)
    shapes.push_back({"square 64", 64, 64, 64, false, false, DType::f16, true});
    shapes.push_back({"edges, B transposed", 100, 36, 40, false, true, DType::f16, true});
    shapes.push_back({"edges, A transposed", 72, 130, 24, true, false, DType::f32});
    shapes.push_back({"hooks", 64, 32, 32, false, true, DType::f16, false, true});
  }
  if (which == "all" || which == "square")
    for (int64_t s : {512, 1024, 2048, 4096, 8192})
      shapes.push_back({cat("square ", s), s, s, s, false, false, DType::f16, s == 4096});
  if (which == "all" || which == "model") {
    // sine at 512x512: a hidden 1x1 conv 256->256 over 262144 pixels (forward, input and weight
    // gradients; the weight gradient lands in fp32).
    shapes.push_back({"sine fwd", 262144, 256, 256, false, true, DType::f16, true});
    shapes.push_back({"sine dgrad", 262144, 256, 256, false, false, DType::f16, true});
    shapes.push_back({"sine wgrad", 256, 256, 262144, true, false, DType::f32});
    // Its first and last 1x1 convs (2 -> 256 and 256 -> 1 channels), the last one's input
    // gradient and both weight gradients: GEMMs too thin for tensor-core tiles (the library runs
    // them on CUDA cores).
    shapes.push_back({"sine conv in", 262144, 256, 2, false, true});
    shapes.push_back({"sine conv out", 262144, 1, 256, false, true});
    shapes.push_back({"sine conv out dgrad", 262144, 256, 1, false, false});
    shapes.push_back({"sine conv in wgrad", 256, 2, 262144, true, false, DType::f32});
    shapes.push_back({"sine conv out wgrad", 1, 256, 262144, true, false, DType::f32});
    // classify, batch 128 on 28x28: the forward im2col GEMMs M = N Ho Wo, N = Cout, K = 9 Cin.
    shapes.push_back({"classify conv1", 128 * 28 * 28, 32, 9, false, true});
    shapes.push_back({"classify conv2", 128 * 14 * 14, 32, 288, false, true});
    shapes.push_back({"classify conv3", 128 * 14 * 14, 64, 288, false, true});
    shapes.push_back({"classify conv4", 128 * 7 * 7, 64, 576, false, true});
  }
  if (which == "depth") {
    // sine's forward GEMM at growing K, plain and with the batch norm hooks: time against K splits
    // a kernel's time into what each of its 2048 tiles costs whatever K (prologue, epilogue,
    // launch) and what each K tile of 64 adds.
    for (int64_t k : {64, 128, 256, 512, 1024})
      shapes.push_back(
          {cat("sine fwd K=", k), 262144, 256, k, false, true, DType::f16, k == 256, true});
  }
  if (which == "all" || which == "resnet50") {
    // ResNet-50 at batch 64, 224x224 (bench_train's resnet50): forward im2col GEMMs M = N Ho Wo,
    // N = Cout, K = kh kw Cin, from the stem to layer4; an input gradient dx = dy @ W; and weight
    // gradients dw = dy^T @ x, summed over every pixel of the batch (fp32 out).
    const int64_t p56 = 64 * 56 * 56, p28 = 64 * 28 * 28, p14 = 64 * 14 * 14, p7 = 64 * 7 * 7;
    shapes.push_back({"resnet50 stem 7x7 3->64", 64 * 112 * 112, 64, 147, false, true});
    shapes.push_back({"resnet50 layer1 1x1 256->64", p56, 64, 256, false, true});
    shapes.push_back({"resnet50 layer1 3x3 64->64", p56, 64, 576, false, true});
    shapes.push_back({"resnet50 layer1 1x1 64->256", p56, 256, 64, false, true, DType::f16, true});
    shapes.push_back(
        {"resnet50 layer2 3x3 128->128", p28, 128, 1152, false, true, DType::f16, true});
    shapes.push_back({"resnet50 layer3 1x1 256->1024", p14, 1024, 256, false, true});
    shapes.push_back({"resnet50 layer4 3x3 512->512", p7, 512, 4608, false, true});
    shapes.push_back({"resnet50 layer1 1x1 64->256 dgrad", p56, 64, 256, false, false});
    shapes.push_back({"resnet50 layer1 3x3 wgrad", 64, 576, p56, true, false, DType::f32});
    shapes.push_back({"resnet50 layer1 1x1 64->256 wgrad", 256, 64, p56, true, false, DType::f32});
    shapes.push_back(
        {"resnet50 layer3 1x1 256->1024 wgrad", 1024, 256, p14, true, false, DType::f32});
  }
  require(!shapes.empty(), "--shapes",
          "expected all, square, model, resnet50, depth or tiny, got '", which, "'");
  return shapes;
}

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(cat(what, ": cuBLAS error ", cublasGetStatusString(status)));
}

cudaDataType cuda_type(DType dtype) { return dtype == DType::f16 ? CUDA_R_16F : CUDA_R_32F; }

// One set of operands on the device.
struct Operands {
  Tensor a, b, c;
};

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B first.
void cublas_gemm(cublasHandle_t handle, const GemmShape& s, const Operands& x) {
  const float one = 1.0f, zero = 0.0f;
  const cublasOperation_t op_b = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ldb = int(s.tb ? s.k : s.n), lda = int(s.ta ? s.m : s.k);
  if (x.a.dtype() == DType::f32) {
    check_cublas(cublasSgemm(handle, op_b, op_a, int(s.n), int(s.m), int(s.k), &one,
                             gpu::ptr<float>(x.b), ldb, gpu::ptr<float>(x.a), lda, &zero,
                             gpu::ptr<float>(x.c), int(s.n)),
                 "cublasSgemm");
    return;
  }
  check_cublas(cublasGemmEx(handle, op_b, op_a, int(s.n), int(s.m), int(s.k), &one, x.b.raw(),
                            CUDA_R_16F, ldb, x.a.raw(), CUDA_R_16F, lda, &zero, x.c.raw(),
                            cuda_type(x.c.dtype()), int(s.n), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

// One way minamp computes a shape: the library's gemm, a version forced, a configuration of the
// sweep, or the library's with batch norm hooks.
struct MinampGemm {
  std::string config; // "library", a version ("v1" ... "v5"), a sweep configuration or hooks
  std::function<void(const GemmShape&, Operands&)> run;
  Tensor column_moments = {}; // f32 [2, N] the run writes (a hook's), checked against C's; or none
};

const MinampGemm kLibraryGemm{"library", [](const GemmShape& s, Operands& x) {
                                kernels::gemm(x.a, s.ta, x.b, s.tb, x.c, GemmEpilogue{});
                              }};

MinampGemm forced_version(GemmVersion version) {
  return {gemm_version_name(version), [version](const GemmShape& s, Operands& x) {
            ScopedGemmVersion scope(version);
            kernels::gemm(x.a, s.ta, x.b, s.tb, x.c, GemmEpilogue{});
          }};
}

// The forward GEMM of a 1x1 conv that follows a batch norm, as a fused layer runs it (GemmShape::
// hooks, B transposed: the conv's weight): with the column statistics of C in its epilogue (what
// the next batch norm needs), with A normalised as it loads (the conv's input, the batch norm's
// output, never written), and both. The normalisation is the identity (gamma 1, beta 0, mean 0,
// invstd 1, no ReLU): the kernel does the same work whatever the values, and C stays the plain
// product, comparable with cuBLAS's.
std::vector<MinampGemm> hook_variants(const GemmShape& s) {
  const auto channel_figure = [&](float value) {
    return Tensor::full({s.k}, value, DType::f32, Device::cuda);
  };
  const Tensor zero = channel_figure(0.0f), one = channel_figure(1.0f);
  const auto variant = [&](const char* config, bool moments, bool normalized) {
    MinampGemm gemm{config, nullptr, {}};
    if (moments) gemm.column_moments = Tensor::empty({2, s.n}, DType::f32, Device::cuda);
    Tensor stats = gemm.column_moments;
    gemm.run = [zero, one, stats, normalized](const GemmShape& shape, Operands& x) mutable {
      GemmEpilogue epilogue;
      if (stats.defined()) epilogue.column_moments = &stats;
      if (!normalized) return kernels::gemm(x.a, false, x.b, true, x.c, epilogue);
      // [M, K] as a [1, M, 1, K] image, the weight [N, K] as [N, 1, 1, K], C [M, N] as [1, M, 1, N]
      const Tensor input = x.a.reshape({1, shape.m, 1, shape.k});
      const Tensor weight = x.b.reshape({shape.n, 1, 1, shape.k});
      Tensor output = x.c.reshape({1, shape.m, 1, shape.n});
      require(kernels::conv2d_normalizes_on_load(input, weight, ConvParams{}), "--shapes", "'",
              shape.name, "': the conv does not normalise its input as it loads it");
      const InputNormalization identity{&one, &zero, &zero, &one, false, nullptr};
      kernels::conv2d_forward(input, weight, output, ConvParams{}, epilogue, &identity);
    };
    return gemm;
  };
  return {variant("+ column moments", true, false), variant("normalized A", false, true),
          variant("normalized A + column moments", true, true)};
}

// Every version of the ladder that the device runs (v4 and v5 need sm_80).
std::vector<MinampGemm> every_version() {
  std::vector<MinampGemm> out;
  const bool mma_sync = gpu::compute_capability() >= gpu::kMmaSyncCapability;
  for (GemmVersion v : {GemmVersion::v1_naive, GemmVersion::v2_wmma, GemmVersion::v3_interior,
                        GemmVersion::v4_mma, GemmVersion::v5_multistage})
    if (mma_sync || v < GemmVersion::v4_mma) out.push_back(forced_version(v));
  return out;
}

// --sweep: v4 and v5 configurations other than the library's, launched alone over the whole C (no
// split K), for the swept shapes (A untransposed, f16 C). One that needs more shared memory than
// the device allows is skipped: a line says so, and `skipped` (the JSON's sweep_skipped) lists it.
std::vector<MinampGemm> sweep(const GemmShape& s, json& skipped) {
  std::vector<MinampGemm> out;
  std::vector<gpu::GemmCandidate> candidates = gpu::gemm_v4_sweep();
  for (gpu::GemmCandidate& candidate : gpu::gemm_v5_sweep()) candidates.push_back(candidate);
  for (const gpu::GemmCandidate& candidate : candidates) {
    const int limit = gpu::max_dynamic_smem();
    if (candidate.smem_bytes > limit) {
      const std::string why =
          cat(s.name, ": ", candidate.name, " skipped, it needs ", candidate.smem_bytes,
              " bytes of shared memory and the device "
              "allows ",
              limit);
      std::printf("%s\n", why.c_str());
      skipped.push_back(why);
      continue;
    }
    const auto run = candidate.run;
    out.push_back({candidate.name, [run](const GemmShape& shape, Operands& x) {
                     require(!shape.ta, "--sweep", "swept shapes have A untransposed; '",
                             shape.name, "' does not");
                     gpu::GemmArgs args;
                     args.a = gpu::matrix_operand(x.a, false);
                     args.b = gpu::matrix_operand(x.b, shape.tb);
                     args.ab_dtype = x.a.dtype();
                     args.c = x.c.raw();
                     args.c_dtype = x.c.dtype();
                     args.m = shape.m, args.n = shape.n, args.k = shape.k;
                     run(args);
                   }});
  }
  return out;
}

// --kernels: each version's kernel for a large GEMM of plain f16 matrices (see GemmKernelInfo).
json kernel_infos() {
  json out = json::array();
  for (const gpu::GemmKernelInfo& info :
       {gpu::gemm_v1_kernel_info(), gpu::gemm_v2_kernel_info(), gpu::gemm_v3_kernel_info(),
        gpu::gemm_v4_kernel_info(), gpu::gemm_v5_kernel_info()})
    out.push_back({{"version", info.version},
                   {"kernel", info.kernel},
                   {"threads", info.threads},
                   {"smem_bytes", info.smem_bytes}});
  return out;
}

// Host values in [-1, 1), already rounded to f16 when the operands are f16 (so the host copy is
// exactly what the device holds).
std::vector<float> random_values(Rng& rng, int64_t n, DType dtype) {
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = rng.uniform(-1.0f, 1.0f);
  if (dtype == DType::f16)
    for (float& v : values) v = round_to_half(v);
  return values;
}

Shape stored_a(const GemmShape& s) { return s.ta ? Shape{s.k, s.m} : Shape{s.m, s.k}; }
Shape stored_b(const GemmShape& s) { return s.tb ? Shape{s.n, s.k} : Shape{s.k, s.n}; }

double at_a(const GemmShape& s, const std::vector<float>& a, int64_t i, int64_t k) {
  return a[static_cast<size_t>(s.ta ? k * s.m + i : i * s.k + k)];
}
double at_b(const GemmShape& s, const std::vector<float>& b, int64_t k, int64_t j) {
  return b[static_cast<size_t>(s.tb ? j * s.k + k : k * s.n + j)];
}

// The largest error of sampled entries of `c` against an fp64 sum, relative to sum |a b| (the
// scale of the rounding error an fp32 accumulation may make).
double spot_error(const GemmShape& s, const std::vector<float>& a, const std::vector<float>& b,
                  const std::vector<float>& c) {
  Rng rng(7);
  double worst = 0;
  for (int sample = 0; sample < 24; ++sample) {
    const int64_t i = rng.below(uint32_t(s.m)), j = rng.below(uint32_t(s.n));
    double sum = 0, magnitude = 0;
    for (int64_t k = 0; k < s.k; ++k) {
      const double term = at_a(s, a, i, k) * at_b(s, b, k, j);
      sum += term;
      magnitude += std::abs(term);
    }
    const double got = c[static_cast<size_t>(i * s.n + j)];
    worst = std::max(worst, std::abs(got - sum) / std::max(magnitude, 1e-30));
  }
  return worst;
}

// max |x - ref| / max |ref| over the whole matrix (NaN when x holds a NaN: unwritten output).
double max_relative_difference(const std::vector<float>& x, const std::vector<float>& ref) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(ref[i])) return NAN;
    diff = std::max(diff, double(std::abs(x[i] - ref[i])));
    scale = std::max(scale, double(std::abs(ref[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// The largest error of the column moments a hook wrote (f32 [2, N]: mean, biased variance) against
// those of C [M, N] in fp64: the means' relative to the largest standard deviation, the
// variances' to the largest variance (NaN for a NaN).
double moments_error(const std::vector<float>& moments, const std::vector<float>& c, int64_t m,
                     int64_t n) {
  std::vector<double> mean(size_t(n), 0.0), var(size_t(n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) mean[size_t(j)] += c[size_t(i * n + j)];
  for (double& v : mean) v /= double(m);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const double centred = c[size_t(i * n + j)] - mean[size_t(j)];
      var[size_t(j)] += centred * centred / double(m);
    }
  double mean_diff = 0, var_diff = 0, largest_var = 0;
  for (int64_t j = 0; j < n; ++j) {
    const float got_mean = moments[size_t(j)], got_var = moments[size_t(n + j)];
    if (std::isnan(got_mean) || std::isnan(got_var)) return NAN;
    mean_diff = std::max(mean_diff, std::abs(got_mean - mean[size_t(j)]));
    var_diff = std::max(var_diff, std::abs(got_var - var[size_t(j)]));
    largest_var = std::max(largest_var, var[size_t(j)]);
  }
  largest_var = std::max(largest_var, 1e-30);
  return std::max(mean_diff / std::sqrt(largest_var), var_diff / largest_var);
}

// Checks minamp against cuBLAS on the first operand set, both outputs poisoned with NaN first
// (and a hook's column moments against cuBLAS's C's).
json check(cublasHandle_t handle, const GemmShape& s, const MinampGemm& minamp, Operands& x,
           const std::vector<float>& a, const std::vector<float>& b) {
  kernels::fill(x.c, NAN);
  Tensor moments = minamp.column_moments;
  if (moments.defined()) kernels::fill(moments, NAN);
  minamp.run(s, x);
  const std::vector<float> ours = x.c.to_vector();
  kernels::fill(x.c, NAN);
  cublas_gemm(handle, s, x);
  const std::vector<float> theirs = x.c.to_vector();
  const double diff = max_relative_difference(ours, theirs);
  const double ours_spot = spot_error(s, a, b, ours), theirs_spot = spot_error(s, a, b, theirs);
  // f16 outputs round to 2^-11 relative; fp32 outputs differ only by the order of the sums.
  const bool c16 = x.c.dtype() == DType::f16;
  const double diff_tol = c16 ? 5e-3 : 1e-3, spot_tol = c16 ? 2e-3 : 1e-4;
  bool ok = diff <= diff_tol && ours_spot <= spot_tol && theirs_spot <= spot_tol;
  json result = {{"max_rel_diff_vs_cublas", diff},
                 {"minamp_fp64_spot_error", ours_spot},
                 {"cublas_fp64_spot_error", theirs_spot},
                 {"tolerances", {diff_tol, spot_tol}}};
  if (moments.defined()) { // from C as stored, which may differ from cuBLAS's by C's rounding
    const double moments_diff = moments_error(moments.to_vector(), theirs, s.m, s.n);
    result["column_moments_error"] = moments_diff;
    ok = ok && moments_diff <= diff_tol;
  }
  result["ok"] = ok;
  return result;
}

// Keeps the GPU busy for `ns` nanoseconds while the host queues the timed runs behind it, so
// they start back to back and the events time the GPU, not the host's launch rate (the small
// shapes take a few microseconds, about as long as queueing one run).
// (On the CPU emulator, where work runs as it is issued, there is nothing to queue behind.)
__global__ void spin_kernel(unsigned long long ns) {
#if defined(MINAMP_CUDA_EMULATOR)
  (void)ns;
#else
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
#endif
}

// Event-timed runs: run(i) is launched `reps` times, each between its own pair of events, queued
// behind a spin of 20 us per run.
class EventTimer {
public:
  explicit EventTimer(int reps) : start_(reps), stop_(reps) {
    for (int i = 0; i < reps; ++i) {
      CUDA_CHECK(cudaEventCreate(&start_[i]), "cudaEventCreate");
      CUDA_CHECK(cudaEventCreate(&stop_[i]), "cudaEventCreate");
    }
  }
  ~EventTimer() {
    for (size_t i = 0; i < start_.size(); ++i) {
      cudaEventDestroy(start_[i]);
      cudaEventDestroy(stop_[i]);
    }
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  std::vector<double> time(const std::function<void(int)>& run) {
    spin_kernel<<<1, 1, 0, gpu::stream()>>>(20000ull * start_.size());
    CUDA_CHECK_LAUNCH("spin_kernel");
    for (size_t i = 0; i < start_.size(); ++i) {
      CUDA_CHECK(cudaEventRecord(start_[i], gpu::stream()), "cudaEventRecord");
      run(int(i));
      CUDA_CHECK(cudaEventRecord(stop_[i], gpu::stream()), "cudaEventRecord");
    }
    CUDA_CHECK(cudaStreamSynchronize(gpu::stream()), "cudaStreamSynchronize");
    std::vector<double> ms;
    for (size_t i = 0; i < start_.size(); ++i) {
      float elapsed = 0;
      CUDA_CHECK(cudaEventElapsedTime(&elapsed, start_[i], stop_[i]), "cudaEventElapsedTime");
      ms.push_back(elapsed);
    }
    return ms;
  }

private:
  std::vector<cudaEvent_t> start_, stop_;
};

double percentile(const std::vector<double>& sorted, double q) {
  const double pos = q * double(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(pos), hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - double(lo)) * (sorted[hi] - sorted[lo]);
}

// The median, p10 and p90 of timed runs (ms) and their count.
json time_spread(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return {{"median_ms", percentile(ms, 0.5)},
          {"p10_ms", percentile(ms, 0.1)},
          {"p90_ms", percentile(ms, 0.9)},
          {"n", ms.size()}};
}

json summarize(const std::vector<double>& ms, double flops) {
  json out = time_spread(ms);
  out["tflops"] = flops / (out["median_ms"].get<double>() * 1e-3) / 1e12;
  return out;
}

// Device memory's copy rate, the byte rate of the step floors bench/report.py reports: a
// device-to-device copy of 8x the L2 (so that it streams from and to device memory; 4 MiB on the
// emulator, whose times mean nothing), event-timed like the GEMMs. The rate counts the bytes read
// and those written.
json copy_rate(size_t l2_bytes) {
  const size_t bytes = cuda_emulated() ? size_t(4) << 20 : 8 * l2_bytes;
  const int64_t floats = int64_t(bytes / sizeof(float));
  const Tensor src = Tensor::zeros({floats}, DType::f32, Device::cuda);
  const Tensor dst = Tensor::empty({floats}, DType::f32, Device::cuda);
  const auto copy = [&](int) {
    CUDA_CHECK(
        cudaMemcpyAsync(dst.raw(), src.raw(), bytes, cudaMemcpyDeviceToDevice, gpu::stream()),
        "bench_gemm: the copy-rate copy");
  };
  EventTimer(3).time(copy);
  json out = time_spread(EventTimer(20).time(copy));
  out["bytes"] = bytes;
  out["gb_per_s"] = 2.0 * double(bytes) / (out["median_ms"].get<double>() * 1e-3) / 1e9;
  return out;
}

struct TimingPlan {
  int reps;   // timed runs per library per round
  int rounds; // minamp and cuBLAS alternate this many times
};

// Enough runs for ~0.3 s per library in all, at least 10 and at most 200 per round.
TimingPlan plan_for(double estimate_ms) {
  const int reps = int(std::clamp(150.0 / std::max(estimate_ms, 1e-3), 10.0, 200.0));
  return {reps, 2};
}

// Warm-up, then rounds of minamp and cuBLAS runs over the rotating operand sets.
json time_both(cublasHandle_t handle, const GemmShape& s, const MinampGemm& minamp,
               std::vector<Operands>& sets, double flops) {
  const auto ours = [&](int i) { minamp.run(s, sets[size_t(i) % sets.size()]); };
  const auto theirs = [&](int i) { cublas_gemm(handle, s, sets[size_t(i) % sets.size()]); };
  EventTimer warmup(5);
  warmup.time(theirs);
  const std::vector<double> first = warmup.time(ours);
  const TimingPlan plan = plan_for(*std::min_element(first.begin(), first.end()));
  EventTimer timer(plan.reps);
  std::vector<double> ours_ms, theirs_ms;
  for (int round = 0; round < plan.rounds; ++round) {
    for (double v : timer.time(ours)) ours_ms.push_back(v);
    for (double v : timer.time(theirs)) theirs_ms.push_back(v);
  }
  return {{"minamp", summarize(ours_ms, flops)}, {"cublas", summarize(theirs_ms, flops)}};
}

// Operand sets: one when a set is larger than the L2, otherwise enough to cover it twice
// (2 to 64 sets), so every timed run reads its inputs from device memory.
std::vector<Operands> make_sets(const GemmShape& s, DType ab, const std::vector<float>& a,
                                const std::vector<float>& b, size_t l2_bytes) {
  const DType c_dtype = ab == DType::f16 ? s.c16 : DType::f32;
  Operands first{Tensor::from_vector(a, stored_a(s), ab, Device::cuda),
                 Tensor::from_vector(b, stored_b(s), ab, Device::cuda),
                 Tensor::empty({s.m, s.n}, c_dtype, Device::cuda)};
  const size_t bytes = first.a.nbytes() + first.b.nbytes() + first.c.nbytes();
  const size_t count =
      bytes >= l2_bytes ? 1 : std::clamp<size_t>((2 * l2_bytes + bytes - 1) / bytes, 2, 64);
  std::vector<Operands> sets{first};
  while (sets.size() < count)
    sets.push_back(
        {first.a.clone(), first.b.clone(), Tensor::empty({s.m, s.n}, c_dtype, Device::cuda)});
  return sets;
}

// One row per way of computing the shape (`minamp`: the library, then any swept
// configurations), all on the same operands, each checked and then timed beside cuBLAS.
void bench_shape(cublasHandle_t handle, const GemmShape& s, DType ab, size_t l2_bytes,
                 const std::vector<MinampGemm>& minamp, const std::function<void(json)>& emit) {
  Rng rng(uint64_t(s.m * 31 + s.n * 17 + s.k));
  const std::vector<float> a = random_values(rng, s.m * s.k, ab);
  const std::vector<float> b = random_values(rng, s.k * s.n, ab);
  std::vector<Operands> sets = make_sets(s, ab, a, b, l2_bytes);
  const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
  for (const MinampGemm& gemm : minamp) {
    json row = {{"shape", s.name},
                {"config", gemm.config},
                {"m", s.m},
                {"n", s.n},
                {"k", s.k},
                {"trans_a", s.ta},
                {"trans_b", s.tb},
                {"ab_dtype", dtype_name(ab)},
                {"c_dtype", dtype_name(sets[0].c.dtype())},
                {"operand_sets", sets.size()}};
    row["check"] = check(handle, s, gemm, sets[0], a, b);
    if (row["check"]["ok"].get<bool>()) {
      const json times = time_both(handle, s, gemm, sets, flops);
      row["minamp"] = times["minamp"];
      row["cublas"] = times["cublas"];
      row["ratio"] =
          times["minamp"]["tflops"].get<double>() / times["cublas"]["tflops"].get<double>();
    }
    emit(row);
  }
}

// A row: the library's under its shape's name, the others indented under it (a sweep's rows,
// which come after every shape's, under a line with the shape's name: new_shape).
void print_row(const json& row, bool new_shape) {
  const std::string config = row["config"].get<std::string>();
  const std::string shape = cat(row["shape"].get<std::string>(), " (", row["m"].get<int64_t>(), "x",
                                row["n"].get<int64_t>(), "x", row["k"].get<int64_t>(), ")");
  if (new_shape && config != "library") std::printf("%s\n", shape.c_str());
  const std::string what = config == "library" ? shape : cat("  ", config);
  if (!row.contains("ratio")) {
    std::printf("%-48s %-4s CHECK FAILED: %s\n", what.c_str(),
                row["ab_dtype"].get<std::string>().c_str(), row["check"].dump().c_str());
    return;
  }
  std::printf("%-48s %-4s %10.2f %10.2f %7.1f%%   (max rel diff %.1e)\n", what.c_str(),
              row["ab_dtype"].get<std::string>().c_str(), row["minamp"]["tflops"].get<double>(),
              row["cublas"]["tflops"].get<double>(), 100 * row["ratio"].get<double>(),
              row["check"]["max_rel_diff_vs_cublas"].get<double>());
  std::fflush(stdout);
}

json device_info() {
  int device = 0, runtime = 0, driver = 0;
  CUDA_CHECK(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  CUDA_CHECK(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
  CUDA_CHECK(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  return {{"name", prop.name},
          {"sm", cat(prop.major, prop.minor)},
          {"sm_count", prop.multiProcessorCount},
          {"l2_bytes", prop.l2CacheSize},
          {"cuda_runtime", runtime},
          {"cuda_driver_api", driver}};
}

// --precisions: f16 and f32 in this order, whichever were given.
std::vector<DType> parse_precisions(const std::string& text) {
  const std::vector<std::string> names = examples::parse_list(text, "--precisions", {"f16", "f32"});
  std::vector<DType> out;
  for (DType dtype : {DType::f16, DType::f32})
    if (std::find(names.begin(), names.end(), dtype_name(dtype)) != names.end())
      out.push_back(dtype);
  return out;
}

int run(int argc, char** argv) {
  CLI::App app{"minamp bench_gemm: minamp's tensor-core (each version) and fp32 GEMMs beside "
               "cuBLAS (TFLOP/s)"};
  std::string shapes_name = "all", precisions = "f16,f32", json_path;
  bool with_sweep = false, kernels_only = false, versions = true;
  app.add_option("--shapes", shapes_name,
                 "all (square, model and resnet50), square, model, resnet50, depth (sine's "
                 "forward GEMM at K = 64 to 1024, also with the batch norm hooks) or tiny (a "
                 "quick check)")
      ->capture_default_str();
  app.add_option("--precisions", precisions,
                 "f16 (tensor cores vs cublasGemmEx), f32 (SIMT vs Sgemm)")
      ->capture_default_str();
  app.add_option("--json", json_path, "write the results to this JSON file")
      ->check(examples::kNonEmptyPath);
  app.add_flag("!--no-versions", versions,
               "time only the library's GEMM, not also each version of the ladder (f16)");
  app.add_flag("--sweep", with_sweep,
               "also time other v4 and v5 configurations than the library's (tile shapes, and "
               "v5's large tile on a persistent grid; f16 square 4096, "
               "sine fwd and dgrad, ResNet-50's layer1 1x1 64->256 and layer2 3x3; in depth, K = "
               "256; in tiny, the first two shapes)");
  app.add_flag("--kernels", kernels_only,
               "print, as JSON, the kernel each version runs at 4096^3 (its name, threads and "
               "shared memory; for bench/gemm_sass.py) and exit; needs no GPU");
  examples::use_one_line_errors(app);
  CLI11_PARSE(app, argc, argv);
  examples::require_valid_environment();
  if (kernels_only) {
    for (const char* name : {"--shapes", "--precisions", "--json", "--no-versions", "--sweep"})
      require(app.count(name) == 0, "--kernels", "prints the kernels and exits; it takes no ",
              name);
    std::printf("%s\n", kernel_infos().dump(2).c_str());
    return 0;
  }
  if (!json_path.empty()) io::require_writable(json_path, "--json");
  const std::vector<GemmShape> shapes = all_shapes(shapes_name);
  const std::vector<DType> dtypes = parse_precisions(precisions);
  if (!cuda_available()) throw Error(cuda_unavailable_reason());

  const json device = device_info();
  cublasHandle_t handle = nullptr;
  check_cublas(cublasCreate(&handle), "cublasCreate");
  check_cublas(cublasSetStream(handle, gpu::stream()), "cublasSetStream");
  int cublas_version = 0;
  check_cublas(cublasGetVersion(handle, &cublas_version), "cublasGetVersion");

  const std::string cublas_name =
      cuda_emulated() ? "cuBLAS: the emulator's CPU stand-in" : cat("cuBLAS ", cublas_version);
  std::printf("bench_gemm on %s (%d SMs, L2 %d MB), %s\n",
              device["name"].get<std::string>().c_str(), device["sm_count"].get<int>(),
              device["l2_bytes"].get<int>() >> 20, cublas_name.c_str());
  const size_t l2_bytes = size_t(device["l2_bytes"].get<int>());
  const json copy = copy_rate(l2_bytes);
  allocator_for(Device::cuda).reset_peak(); // the GEMMs' peak, not the copy's buffers
  std::printf("device-to-device copy: %.0f GB/s (bytes read and written)\n",
              copy["gb_per_s"].get<double>());
  std::printf("%-48s %-4s %10s %10s %8s\n", "shape (MxNxK)", "in", "minamp", "cuBLAS", "ratio");
  json rows = json::array(), sweep_skipped = json::array();
  // The JSON so far, written after every row: a kernel that faults or hangs (killed by the
  // caller's time limit) keeps the rows before it, each shape's library row ahead of its hooks'
  // and versions', and every shape's ahead of the sweep's.
  const auto save = [&] {
    if (json_path.empty()) return;
    const json result = {{"framework", "minamp"},
                         {"device", device},
                         {"cublas_version", cublas_version},
                         {"cublas_math_mode", "default (Sgemm is plain fp32, no TF32)"},
                         {"gemm_persistent_tiles", gemm_persistent_tiles()},
                         {"copy", copy},
                         {"minamp_peak_device_bytes", allocator_for(Device::cuda).peak_bytes()},
                         {"timing",
                          "CUDA events per run on one stream, queued behind a spin kernel, median; "
                          "minamp and cuBLAS alternate in 2 rounds after 5 warm-up runs each"},
                         {"rows", rows},
                         {"sweep_skipped", sweep_skipped}};
    io::write_file_atomically(json_path, result.dump(2) + "\n");
  };
  bool all_ok = true;
  std::string last_shape;
  const auto emit = [&](json row) {
    all_ok = all_ok && row["check"]["ok"].get<bool>();
    const std::string shape = row["shape"].get<std::string>();
    print_row(row, shape != last_shape);
    last_shape = shape;
    rows.push_back(std::move(row));
    save();
  };
  for (DType ab : dtypes) {
    for (const GemmShape& s : shapes) {
      std::vector<MinampGemm> minamp{kLibraryGemm};
      if (s.hooks && ab == DType::f16)
        for (MinampGemm& hook : hook_variants(s)) minamp.push_back(std::move(hook));
      if (versions && ab == DType::f16)
        for (MinampGemm& version : every_version()) minamp.push_back(std::move(version));
      bench_shape(handle, s, ab, l2_bytes, minamp, emit);
    }
    // The sweep's tuning rows after every shape's own, so that a time limit cuts them first.
    if (with_sweep && ab == DType::f16)
      for (const GemmShape& s : shapes)
        if (s.sweep) bench_shape(handle, s, ab, l2_bytes, sweep(s, sweep_skipped), emit);
  }
  cublasDestroy(handle);
  save();
  if (!json_path.empty()) std::printf("wrote %s\n", json_path.c_str());
  return all_ok ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fflush(stdout); // the table so far first, also when stdout is a pipe
    std::fprintf(stderr, "bench_gemm: error: %s\n", e.what());
    return 1;
  }
}
