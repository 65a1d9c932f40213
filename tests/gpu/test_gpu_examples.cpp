// The programs on the CUDA backend as a user runs them: --device auto picks it, mlp and sine
// --compare with --device cuda (FP32, then AMP from the same init) print their table and end where
// the same runs on the CPU end; bench_train's GPU path (CUDA events, op profile, graph replay)
// writes every run (ResNet-50 too), and bench_gemm checks and times every precision against cuBLAS.
// Compiled once per backend: MINAMP_EXAMPLE_SUFFIX names that backend's binaries ("" for the CUDA
// build, "_emulated" for the ones linked with the CPU emulator).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "cpu/test_program.h"
#include "test_util.h"

namespace {

using minamp::test::field;
using minamp::test::fresh_dir;
using minamp::test::ProgramRun;
using minamp::test::read_output_json;
using minamp::test::run_program;

// Runs `example --compare args` on the CPU and on the GPU. For FP32 and AMP both runs take the
// same steps and skip the same ones, and their final losses agree within the relative tolerance.
void expect_compare_matches_cpu(const std::string& example, const std::string& args,
                                double fp32_tolerance, double amp_tolerance) {
  const std::string cpu = fresh_dir(example + "_compare_cpu");
  const std::string gpu = fresh_dir(example + "_compare_gpu");
  ProgramRun run = run_program(example, "--device cpu --compare " + args + " --out " + cpu);
  ASSERT_EQ(run.status, 0) << run.output;
  run = run_program(example + MINAMP_EXAMPLE_SUFFIX,
                    "--device cuda --compare " + args + " --out " + gpu);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("memory saved"), std::string::npos) << run.output;
  for (const char* precision : {"fp32", "amp"}) {
    const nlohmann::json on_cpu = read_output_json(cpu + "/" + precision + "/summary.json");
    const nlohmann::json on_gpu = read_output_json(gpu + "/" + precision + "/summary.json");
    ASSERT_TRUE(on_cpu.contains("final_loss") && on_gpu.contains("final_loss")) << precision;
    EXPECT_EQ(field(on_gpu, "device"), "cuda") << precision;
    EXPECT_EQ(field(on_gpu, "device_name"), minamp::device_description(minamp::Device::cuda))
        << precision;
    EXPECT_EQ(field(on_gpu, "steps"), field(on_cpu, "steps")) << precision;
    EXPECT_EQ(field(on_gpu, "skipped_steps"), field(on_cpu, "skipped_steps")) << precision;
    const double gpu_loss = on_gpu.at("final_loss"), cpu_loss = on_cpu.at("final_loss");
    const double tolerance = std::string(precision) == "amp" ? amp_tolerance : fp32_tolerance;
    EXPECT_TRUE(std::isfinite(gpu_loss)) << precision;
    EXPECT_LE(std::abs(gpu_loss - cpu_loss), tolerance * std::abs(cpu_loss))
        << example << " " << precision << ": GPU " << gpu_loss << ", CPU " << cpu_loss;
  }
}

// Tolerances: FP32 runs differ in summation order only (the emulator's runs agree with the CPU to
// ~1e-7); AMP runs also round activations to f16 where a different order can flip a rounding
// (~1e-3 on the emulator for sine), and sine's Adam steps magnify small gradient differences, so
// they get more room. The step-by-step parity is GpuTraining's; these catch a wrong setting on the
// way from the command line (an SGD lr off by 50% moves mlp's final loss by 2.6e-3).
TEST(GpuExamples, MlpCompareOnCudaEndsWhereTheCpuRunDoes) {
  MINAMP_REQUIRE_GPU();
  expect_compare_matches_cpu("mlp", "--epochs 2", 2e-5, 5e-4);
}

TEST(GpuExamples, SineCompareOnCudaEndsWhereTheCpuRunDoes) {
  MINAMP_REQUIRE_GPU();
  expect_compare_matches_cpu("sine", "--size 16 --hidden 32 --steps 30", 1e-3, 2e-2);
}

// transfer: a narrow ResNet-18 fine-tuned on the image-folder fixture, FP32 and AMP, with a
// frozen backbone in AMP too (the mix of frozen and trainable parameters through the GPU's
// optimizer and scaler). Losses after 3 Adam steps: the GPU's within 1e-4 of the CPU's in FP32.
TEST(GpuExamples, TransferCompareOnCudaEndsWhereTheCpuRunDoes) {
  MINAMP_REQUIRE_GPU();
  const std::string args = std::string("--images ") + MINAMP_SOURCE_DIR +
                           "/data/tiny-images --arch resnet18 --width 4 --image-size 64 "
                           "--batch-size 2 --epochs 1 --val-fraction 0.34";
  expect_compare_matches_cpu("transfer", args, 1e-4, 2e-2);
  expect_compare_matches_cpu("transfer", args + " --freeze-backbone", 1e-4, 2e-2);
}

// The README's loop (examples/minimal_amp.cpp) on the GPU prints the CPU run's losses at the
// same scale. Adam at lr 1e-2 magnifies f16 rounding differences as sine's does (the emulator's
// truncating tensor-core sums end 0.6% from the CPU at step 19), hence sine's AMP tolerance.
TEST(GpuExamples, MinimalAmpOnCudaPrintsTheCpuRunsLosses) {
  MINAMP_REQUIRE_GPU();
  const ProgramRun cpu = run_program("minimal_amp", "--device cpu --steps 20");
  const ProgramRun gpu =
      run_program(std::string("minimal_amp") + MINAMP_EXAMPLE_SUFFIX, "--device cuda --steps 20");
  ASSERT_EQ(cpu.status, 0) << cpu.output;
  ASSERT_EQ(gpu.status, 0) << gpu.output;
  std::istringstream cpu_lines(cpu.output), gpu_lines(gpu.output);
  std::string cpu_word, gpu_word;
  int losses = 0;
  while (cpu_lines >> cpu_word && gpu_lines >> gpu_word) {
    if (cpu_word != "loss" && cpu_word != "scale") {
      EXPECT_EQ(gpu_word, cpu_word);
      continue;
    }
    double on_cpu = 0, on_gpu = 0;
    ASSERT_TRUE(cpu_lines >> on_cpu && gpu_lines >> on_gpu) << gpu.output;
    const double tolerance = cpu_word == "loss" ? 2e-2 * std::abs(on_cpu) : 0.0;
    EXPECT_LE(std::abs(on_gpu - on_cpu), tolerance) << cpu_word << ": " << gpu.output;
    losses += cpu_word == "loss";
  }
  EXPECT_EQ(losses, 2) << gpu.output; // steps 0 and 19
}

// The summary.json of this backend's `example` run with `args` into a fresh folder `name`; when
// the run fails, one test failure with its output and an empty object.
nlohmann::json summary_of_run(const std::string& example, const std::string& args,
                              const std::string& name) {
  const std::string out = fresh_dir(name);
  const ProgramRun run = run_program(example + MINAMP_EXAMPLE_SUFFIX, args + " --out " + out);
  if (run.status == 0) return read_output_json(out + "/summary.json");
  ADD_FAILURE() << example << MINAMP_EXAMPLE_SUFFIX << " " << args << " failed (status "
                << run.status << "): " << run.output;
  return nlohmann::json::object();
}

// A run that fails (here: a program that is not there) fails the test that reads its output,
// naming what is missing, and leaves the other tests to run: it must not abort the test binary.
TEST(GpuExamples, AFailedRunFailsItsTestAndNoOther) {
  static nlohmann::json summary; // EXPECT_NONFATAL_FAILURE takes no local variables
  EXPECT_NONFATAL_FAILURE(summary = summary_of_run("no_such_example", "--epochs 1", "no_run"),
                          "no_such_example");
  EXPECT_NONFATAL_FAILURE(field(summary, "device"), "no 'device' in {}");
  EXPECT_NONFATAL_FAILURE(read_output_json(fresh_dir("no_run") + "/summary.json"),
                          "no_run/summary.json");
}

TEST(GpuExamples, DeviceAutoTrainsOnTheGpuWhenThereIsOne) {
  MINAMP_REQUIRE_GPU();
  const nlohmann::json summary =
      summary_of_run("mlp", "--device auto --epochs 1 --batches 2", "mlp_device_auto");
  EXPECT_EQ(field(summary, "device"), "cuda");
}

// Without --size, sine trains on the blog's 512x512 grid on a GPU and on 16x16 on the emulator.
TEST(GpuExamples, SineDefaultSizeFollowsTheDevice) {
  MINAMP_REQUIRE_GPU();
  const nlohmann::json summary =
      summary_of_run("sine", "--device cuda --hidden 8 --layers 0 --steps 1", "sine_default_size");
  EXPECT_EQ(field(field(summary, "config"), "size"), minamp::cuda_emulated() ? "16" : "512");
}

// mlp and sine in every precision and mode bench/run-gpu.sh asks for, at a tiny size: the JSON
// holds each run, training runs carry their op profile, the CUDA-graph replay of a step trains
// exactly like the eager steps (same kernels in the same order), and the unfused training runs
// from the same init (mlp, which has no batch norm, exactly as fused; sine to rounding).
TEST(GpuExamples, BenchTrainWritesEveryRunOnCuda) {
  MINAMP_REQUIRE_GPU();
  const std::string json = fresh_dir("bench_train_cuda.json");
  const ProgramRun run =
      run_program(std::string("bench_train") + MINAMP_EXAMPLE_SUFFIX,
                  "--device cuda --models mlp,sine --size 16 --steps 3 --warmup 1 --infer-steps 2 "
                  "--profile 2 --cuda-graph --unfused --json " +
                      json);
  ASSERT_EQ(run.status, 0) << run.output;
  const nlohmann::json report = read_output_json(json);
  EXPECT_EQ(field(report, "device"), "cuda");
  // ResNet-50, fully trained and with a frozen backbone: narrow and small here.
  const std::string resnet_json = fresh_dir("bench_train_resnet_cuda.json");
  const ProgramRun resnet =
      run_program(std::string("bench_train") + MINAMP_EXAMPLE_SUFFIX,
                  "--device cuda --models resnet50,resnet50-frozen --resnet-size 32 "
                  "--resnet-batch 2 --resnet-width 4 --steps 1 --warmup 1 --infer-steps 1 --json " +
                      resnet_json);
  ASSERT_EQ(resnet.status, 0) << resnet.output;
  const nlohmann::json resnet_runs = field(read_output_json(resnet_json), "runs");
  EXPECT_EQ(resnet_runs.size(), 12u) << "two models x FP32, AMP and AMP-bf16 x train and infer";
  for (const nlohmann::json& r : resnet_runs) {
    if (r.at("mode") == "train") {
      EXPECT_TRUE(std::isfinite(r.at("final_loss").get<double>()));
    }
  }
  std::map<std::string, double> final_loss;
  for (const nlohmann::json& r : field(report, "runs")) {
    const std::string name =
        r.at("model").get<std::string>() + " " + r.at("precision").get<std::string>() + " ";
    const std::string mode = r.at("mode");
    final_loss[name + mode] = mode == "infer" ? 0.0 : r.at("final_loss").get<double>();
    if (mode == "train" || mode == "train-unfused") {
      EXPECT_FALSE(field(field(r, "profile"), "ops").empty()) << name << mode;
    }
  }
  EXPECT_EQ(final_loss.size(), 24u)
      << "mlp and sine x FP32, AMP and AMP-bf16 x train, infer, train-graph, train-unfused";
  for (const char* name :
       {"mlp fp32 ", "mlp amp ", "mlp amp-bf16 ", "sine fp32 ", "sine amp ", "sine amp-bf16 "}) {
    const std::string key = name;
    ASSERT_TRUE(final_loss.count(key + "train") && final_loss.count(key + "train-graph")) << key;
    EXPECT_TRUE(std::isfinite(final_loss.at(key + "train"))) << key;
    EXPECT_EQ(final_loss.at(key + "train-graph"), final_loss.at(key + "train")) << key;
    ASSERT_TRUE(final_loss.count(key + "train-unfused")) << key;
    const double unfused = final_loss.at(key + "train-unfused");
    if (key.rfind("mlp", 0) == 0) {
      EXPECT_EQ(unfused, final_loss.at(key + "train")) << key;
    } else {
      EXPECT_NEAR(unfused, final_loss.at(key + "train"), 0.05 * final_loss.at(key + "train"))
          << key;
    }
  }
}

// bench_gemm's quick shapes (square and edge tiles, both transposes, f16 and f32 outputs, the
// batch norm hooks): every result — the library's, each GEMM version's, each hook's and each sweep
// configuration's — passes its check against cuBLAS and an fp64 sum (a hook's column moments
// against cuBLAS's C's), and gets a time for both libraries; the copy rate is recorded beside them.
TEST(GpuExamples, BenchGemmChecksAndTimesEveryShape) {
  MINAMP_REQUIRE_GPU();
  const std::string json = fresh_dir("bench_gemm_cuda.json");
  const ProgramRun run = run_program(std::string("bench_gemm") + MINAMP_EXAMPLE_SUFFIX,
                                     "--shapes tiny --sweep --json " + json);
  ASSERT_EQ(run.status, 0) << run.output;
  const nlohmann::json report = read_output_json(json);
  // 4 shapes x f16, f32 with the library's kernels, the f16 ones also with each of the 5 versions;
  // the hooks shape in f16 with its 3 hooks; the first two f16 shapes also with each of the sweep's
  // 7 configurations, less those the device has too little shared memory for (the persistent one
  // below sm_90; none on the emulator).
  ASSERT_EQ(field(report, "rows").size(),
            8u + 4u * 5u + 3u + 2u * 7u - field(report, "sweep_skipped").size());
  std::set<std::string> configs;
  int moments_checked = 0;
  for (const nlohmann::json& row : report.at("rows")) {
    const std::string what = row.at("shape").get<std::string>() + " " + row.at("ab_dtype").dump() +
                             " " + row.at("config").get<std::string>();
    configs.insert(row.at("config").get<std::string>());
    EXPECT_TRUE(row.at("check").at("ok").get<bool>()) << what << ": " << row.at("check").dump();
    if (row.at("check").contains("column_moments_error")) ++moments_checked;
    ASSERT_TRUE(row.contains("ratio")) << what;
    // TFLOP/s is 2 M N K over the median time; the ratio is minamp's over cuBLAS's.
    const double flops =
        2.0 * row.at("m").get<double>() * row.at("n").get<double>() * row.at("k").get<double>();
    for (const char* library : {"minamp", "cublas"}) {
      const nlohmann::json& t = row.at(library);
      const double median_ms = t.at("median_ms").get<double>();
      EXPECT_GT(median_ms, 0.0) << what << " " << library;
      EXPECT_LE(t.at("p10_ms").get<double>(), median_ms) << what << " " << library;
      EXPECT_GE(t.at("p90_ms").get<double>(), median_ms) << what << " " << library;
      const double tflops = flops / (median_ms * 1e9);
      EXPECT_NEAR(t.at("tflops").get<double>(), tflops, 1e-9 * tflops) << what << " " << library;
    }
    const double ratio =
        row.at("minamp").at("tflops").get<double>() / row.at("cublas").at("tflops").get<double>();
    EXPECT_NEAR(row.at("ratio").get<double>(), ratio, 1e-12 * ratio) << what;
  }
  EXPECT_EQ(moments_checked, 2) << "the two hooks with the column moments";
  // Device memory's copy rate: the bytes read and written over the median copy time.
  const nlohmann::json& copy = field(report, "copy");
  const double copy_ms = copy.at("median_ms").get<double>(), bytes = copy.at("bytes").get<double>();
  EXPECT_GT(bytes, 0.0);
  EXPECT_GT(copy_ms, 0.0);
  EXPECT_LE(copy.at("p10_ms").get<double>(), copy_ms);
  EXPECT_GE(copy.at("p90_ms").get<double>(), copy_ms);
  const double gb_per_s = 2.0 * bytes / (copy_ms * 1e6);
  EXPECT_NEAR(copy.at("gb_per_s").get<double>(), gb_per_s, 1e-9 * gb_per_s);
  if (report.at("sweep_skipped").empty()) {
    EXPECT_EQ(configs.size(), 16u) << "library + 5 versions + 3 hooks + 7 swept configurations";
  }
}

} // namespace
