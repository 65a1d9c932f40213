"""Tests of bench/report.py, the script that turns benchmark JSON into the results tables and
decides met / missed: every verdict is computed from made-up runs whose ratios are known, on
the CPU and GPU target lists, with missing and failed parts. Standard library only (ctest runs it
as bench.report with the python3 that CMake found)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "report.py")


def run_record(model, precision, mode, median_ms, peak_bytes=None, loss=None, **extra):
    run = {"model": model, "precision": precision, "mode": mode,
           "step_ms": {"median": median_ms, "p10": median_ms * 0.9, "p90": median_ms * 1.1},
           "peak_bytes": peak_bytes}
    if loss is not None:
        run.update(final_loss=loss, loss_last10_mean=loss)
    run.update(extra)
    return run


def every_run(framework, ms, peak=None, loss=1.0, modes=("train", "infer")):
    """Each model of ms in FP32, AMP and AMP-bf16 with the same step time ms[model]."""
    return [run_record(m, p, mode, ms[m], peak, loss if mode != "infer" else None)
            for m in ms for p in ("fp32", "amp", "amp-bf16") for mode in modes]


class Report:
    """report.py run on JSON files written into a temporary folder."""

    def __init__(self, test, platform, minamp=None, pytorch=None, gemm=None, seeds=(), cwd=None):
        self.dir = tempfile.TemporaryDirectory()
        test.addCleanup(self.dir.cleanup)
        args = [sys.executable, REPORT, "--platform", platform, "--commit", "abc1234",
                "--out", self.path("report.json"), "--markdown", self.path("report.md")]
        if minamp is not None:  # else none given, as for bench_gemm's results alone
            args += ["--minamp", self.write("minamp.json", minamp)]
        args += ["--pytorch", self.write("pytorch.json", pytorch)]
        if seeds:
            args += ["--minamp-seeds"] + [self.write(f"seed{i}.json", result)
                                          for i, result in enumerate(seeds)]
        if platform == "gpu":
            args += ["--gemm", self.write("gemm.json", gemm)]
        self.process = subprocess.run(args, capture_output=True, text=True, cwd=cwd)

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def write(self, name, content):
        if content is not None:
            with open(self.path(name), "w") as f:
                json.dump(content, f)
        return self.path(name)

    def combined(self):
        with open(self.path("report.json")) as f:
            return json.load(f)

    def targets(self):
        return {t["target"]: t for t in self.combined()["targets"]}


def minamp_result(runs, size=64, seed=0):
    return {"framework": "minamp", "threads": 2, "sine_size": size, "seed": seed, "runs": runs,
            "models": {}}


def sine_from_seed(seed, fp32_loss, amp_loss, bf16_loss=None):
    """bench_train's result of sine trained from another seed: FP32, AMP and (with bf16_loss)
    AMP-bf16, with these losses."""
    losses = (("fp32", fp32_loss), ("amp", amp_loss)) + \
        ((("amp-bf16", bf16_loss),) if bf16_loss is not None else ())
    runs = [run_record("sine", precision, "train", 30.0, final_loss=loss, loss_last10_mean=loss)
            for precision, loss in losses]
    return minamp_result(runs, seed=seed)


def pytorch_result(runs, size=64):
    return {"framework": "pytorch", "torch_version": "2.x", "threads": 2, "tf32_matmul": False,
            "tf32_cudnn": True, "sine_size": size, "runs": runs, "models": {}}


class CpuTargets(unittest.TestCase):
    def test_ratios_and_verdicts_follow_the_medians(self):
        minamp = every_run("minamp", {"mlp": 0.1, "sine": 30.0, "classify": 60.0, "resnet18": 50.0},
                           peak=100)
        for run in minamp:  # AMP uses half the memory of FP32 on sine, and a 10% higher loss
            if run["precision"] == "amp" and run["mode"] == "train":
                run["peak_bytes"] = 50
                run["loss_last10_mean"] = 1.1
            if run["mode"] == "infer":  # inference peaks, which no training target reads
                run["peak_bytes"] = 25
        pytorch = every_run("pytorch",
                            {"mlp": 0.4, "sine": 20.0, "classify": 60.0, "resnet18": 40.0})
        report = Report(self, "cpu", minamp_result(minamp), pytorch_result(pytorch))
        self.assertEqual(report.process.returncode, 0, report.process.stderr)
        targets = report.targets()
        resnet18 = targets["resnet18 FP32 forward, batch 1, 224^2, vs PyTorch CPU eager FP32"]
        self.assertAlmostEqual(resnet18["ratio"], 1.25)
        self.assertEqual(resnet18["status"], "missed")
        mlp = targets["mlp FP32 step vs PyTorch CPU eager FP32"]
        self.assertAlmostEqual(mlp["ratio"], 0.25)
        self.assertEqual(mlp["status"], "met")
        sine = targets["sine 64^2 FP32 step vs PyTorch CPU eager FP32"]
        self.assertAlmostEqual(sine["ratio"], 1.5)
        self.assertEqual(sine["status"], "missed")
        memory = targets["sine 64^2 AMP peak memory vs minamp FP32"]
        self.assertAlmostEqual(memory["ratio"], 0.5)
        self.assertEqual(memory["status"], "met")
        loss = targets["sine AMP final loss vs FP32 (last-10 mean)"]
        self.assertAlmostEqual(loss["ratio"], 0.1)
        self.assertEqual(loss["status"], "missed")
        self.assertEqual(report.combined()["meta"]["missing"], [])
        with open(report.path("report.md")) as f:
            self.assertIn("| mlp FP32 step vs PyTorch CPU eager FP32 | 0.1 ms | 0.4 ms | 0.25 |",
                          f.read())

    def test_a_ratio_on_its_bound_meets_it(self):
        minamp = every_run("minamp", {"mlp": 0.4, "sine": 30.0, "classify": 60.0})
        pytorch = every_run("pytorch", {"mlp": 0.4, "sine": 20.0, "classify": 60.0})
        report = Report(self, "cpu", minamp_result(minamp), pytorch_result(pytorch))
        self.assertEqual(report.process.returncode, 0, report.process.stderr)
        mlp = report.targets()["mlp FP32 step vs PyTorch CPU eager FP32"]
        self.assertEqual(mlp["ratio"], 1.0)
        self.assertEqual(mlp["status"], "met")

    def test_a_loss_that_is_not_finite_misses(self):
        minamp = every_run("minamp", {"mlp": 0.1, "sine": 30.0, "classify": 60.0}, peak=100)
        for run in minamp:
            if run["model"] == "mlp" and run["precision"] == "amp" and run["mode"] == "train":
                run["loss_last10_mean"] = None  # bench_train writes NaN as null
            if run["model"] == "sine" and run["precision"] == "fp32" and run["mode"] == "train":
                run["loss_last10_mean"] = None  # the reference side too
        report = Report(self, "cpu", minamp_result(minamp), None)
        for model in ("mlp", "sine"):
            target = report.targets()[f"{model} AMP final loss vs FP32 (last-10 mean)"]
            self.assertEqual(target["status"], "missed (loss not finite)", model)

    def test_the_bounds_are_the_targets(self):
        minamp = every_run("minamp", {"mlp": 0.1, "sine": 30.0, "classify": 60.0}, peak=100)
        bounds = {t["target"]: t["bound"]
                  for t in Report(self, "cpu", minamp_result(minamp), None).combined()["targets"]}
        self.assertEqual(bounds, {
            "sine 64^2 FP32 step vs PyTorch CPU eager FP32": 1.0,
            "mlp FP32 step vs PyTorch CPU eager FP32": 1.0,
            "resnet18 FP32 forward, batch 1, 224^2, vs PyTorch CPU eager FP32": 1.0,
            "sine 64^2 AMP peak memory vs minamp FP32": 0.55,
            "sine AMP final loss vs FP32 (last-10 mean)": 0.05,
            "mlp AMP final loss vs FP32 (last-10 mean)": 0.05,
            "sine 64^2 AMP-bf16 peak memory vs minamp FP32": 0.55,
            "sine AMP-bf16 final loss vs FP32 (last-10 mean)": 0.05,
            "mlp AMP-bf16 final loss vs FP32 (last-10 mean)": 0.05})

    def test_missing_and_failed_parts_are_listed_and_the_rest_reported(self):
        minamp = [r for r in every_run("minamp", {"mlp": 0.1, "sine": 30.0, "classify": 60.0},
                                       peak=100) if r["model"] != "classify"]
        minamp.append({"model": "classify", "precision": "amp", "mode": "train",
                       "error": "out of memory"})
        report = Report(self, "cpu", minamp_result(minamp), None)
        self.assertEqual(report.process.returncode, 0, report.process.stderr)
        missing = report.combined()["meta"]["missing"]
        self.assertIn("minamp classify: no fp32 train, fp32 infer, amp-bf16 train, amp-bf16 infer",
                      missing)
        self.assertIn("minamp classify amp train: failed (out of memory)", missing)
        self.assertIn("PyTorch mlp: no results", missing)
        target = report.targets()["mlp FP32 step vs PyTorch CPU eager FP32"]
        self.assertEqual(target["status"], "not measured")

    def test_a_failed_optional_mode_is_listed_alone(self):
        ms = {"mlp": 0.1, "sine": 30.0, "classify": 60.0, "resnet18": 50.0}
        minamp = every_run("minamp", ms, peak=100)
        minamp.append({"model": "mlp", "precision": "amp", "mode": "train-graph",
                       "error": "capture failed"})
        pytorch = every_run("pytorch", dict(ms, mlp=0.4))
        del pytorch[0]  # mlp fp32 train
        report = Report(self, "cpu", minamp_result(minamp), pytorch_result(pytorch))
        self.assertEqual(report.combined()["meta"]["missing"],
                         ["minamp mlp amp train-graph: failed (capture failed)",
                          "PyTorch mlp: no fp32 train"])

    def test_the_sine_loss_over_seeds_is_an_info_row_of_the_means(self):
        minamp = every_run("minamp", {"mlp": 0.1, "sine": 30.0, "classify": 60.0}, peak=100)
        for run in minamp:  # seed 0: AMP 20% under FP32, the target missed
            if run["model"] == "sine" and run["mode"] == "train":
                run["loss_last10_mean"] = 1.0 if run["precision"] == "fp32" else 0.8
        seeds = [sine_from_seed(1, 0.8, 0.9), sine_from_seed(2, 0.7, 0.8), None]  # seed 3 failed
        report = Report(self, "cpu", minamp_result(minamp), None, seeds=seeds)
        self.assertEqual(report.process.returncode, 0, report.process.stderr)
        targets = report.targets()
        self.assertEqual(targets["sine AMP final loss vs FP32 (last-10 mean)"]["status"], "missed")
        row = targets["sine AMP final loss vs FP32, mean over seeds 0, 1, 2 (last-10 means)"]
        self.assertAlmostEqual(row["minamp"], 2.5 / 3)
        self.assertAlmostEqual(row["reference"], 2.5 / 3)
        self.assertAlmostEqual(row["ratio"], 0.0)
        self.assertEqual(row["status"], "info (the target over seeds)")
        with open(report.path("report.md")) as f:
            self.assertIn("by seed: seed 0 0.8, seed 1 1.12, seed 2 1.14.", f.read())

    def test_the_row_over_seeds_gives_the_gap_whichever_side_is_lower(self):
        minamp = every_run("minamp", {"mlp": 0.1, "sine": 30.0, "classify": 60.0}, peak=100)
        report = Report(self, "cpu", minamp_result(minamp), None,
                        seeds=[sine_from_seed(1, 1.0, 0.5)])  # AMP means 0.75, FP32 1.0
        row = report.targets()["sine AMP final loss vs FP32, mean over seeds 0, 1 (last-10 means)"]
        self.assertAlmostEqual(row["ratio"], 0.25)

    def test_a_seed_whose_loss_is_not_finite_shows_in_the_row_over_seeds(self):
        minamp = every_run("minamp", {"mlp": 0.1, "sine": 30.0, "classify": 60.0}, peak=100)
        report = Report(self, "cpu", minamp_result(minamp), None,
                        seeds=[sine_from_seed(1, 1.0, None)])
        row = report.targets()["sine AMP final loss vs FP32, mean over seeds 0, 1 (last-10 means)"]
        self.assertEqual(row["status"], "missed (loss not finite)")
        with open(report.path("report.md")) as f:
            self.assertIn("by seed: seed 0 1, seed 1 n/a.", f.read())

    def test_the_bf16_loss_over_seeds_is_the_target_and_one_seed_is_info(self):
        minamp = every_run("minamp", {"mlp": 0.1, "sine": 30.0, "classify": 60.0}, peak=100)
        for run in minamp:  # seed 0: AMP-bf16 10% over FP32
            if run["model"] == "sine" and run["mode"] == "train":
                run["loss_last10_mean"] = {"fp32": 1.0, "amp": 1.0, "amp-bf16": 1.1}[run["precision"]]
        seeds = [sine_from_seed(1, 1.0, 1.0, 0.93), sine_from_seed(2, 1.0, 1.0, 0.99)]
        targets = Report(self, "cpu", minamp_result(minamp), None, seeds=seeds).targets()
        one = targets["sine AMP-bf16 final loss vs FP32 (last-10 mean)"]
        self.assertAlmostEqual(one["ratio"], 0.1)
        self.assertEqual(one["status"], "info (one seed; the target is the mean over seeds)")
        row = targets["sine AMP-bf16 final loss vs FP32, mean over seeds 0, 1, 2 (last-10 means)"]
        self.assertAlmostEqual(row["minamp"], 3.02 / 3)
        self.assertAlmostEqual(row["ratio"], 0.02 / 3)
        self.assertEqual(row["status"], "met")
        seeds[1] = sine_from_seed(2, 1.0, 1.0, 1.2)  # the mean 8% over FP32's
        targets = Report(self, "cpu", minamp_result(minamp), None, seeds=seeds).targets()
        row = targets["sine AMP-bf16 final loss vs FP32, mean over seeds 0, 1, 2 (last-10 means)"]
        self.assertEqual(row["status"], "missed")

    def test_one_seed_alone_gives_no_row_over_seeds(self):
        minamp = every_run("minamp", {"mlp": 0.1, "sine": 30.0, "classify": 60.0}, peak=100)
        report = Report(self, "cpu", minamp_result(minamp), None, seeds=[None])
        self.assertFalse(any("over seeds" in name for name in report.targets()))

    def test_runs_without_peak_bytes_leave_the_memory_row_unmeasured(self):
        minamp = every_run("minamp", {"mlp": 0.1, "sine": 30.0, "classify": 60.0})
        report = Report(self, "cpu", minamp_result(minamp), None)
        self.assertEqual(report.process.returncode, 0, report.process.stderr)
        target = report.targets()["sine 64^2 AMP peak memory vs minamp FP32"]
        self.assertEqual(target["status"], "not measured")

    def test_no_results_at_all_writes_nothing(self):
        report = Report(self, "cpu", None, None)
        self.assertNotEqual(report.process.returncode, 0)
        self.assertIn("no results at all", report.process.stderr)
        self.assertFalse(os.path.exists(report.path("report.json")))
        self.assertFalse(os.path.exists(report.path("report.md")))


class GpuTargets(unittest.TestCase):
    def gpu_report(self, gemm_check_failed=False, bf16_factor=1.0, copy=True, sine_gemms=True):
        ms = {"mlp": 0.05, "sine": 4.0, "classify": 2.0, "resnet50": 30.0}
        minamp = every_run("minamp", ms, peak=100, modes=("train", "train-graph", "infer"))
        for run in minamp:  # AMP-bf16 steps bf16_factor times AMP-f16's
            if run["precision"] == "amp-bf16":
                run["step_ms"] = {k: v * bf16_factor for k, v in run["step_ms"].items()}
        pytorch = every_run("pytorch", {"mlp": 1.0, "sine": 4.0, "classify": 2.0, "resnet50": 40.0},
                            peak=100,
                            modes=("train", "train-nchw", "train-fused", "train-compile", "infer"))
        for run in pytorch:
            run["cublas_workspace_bytes"] = 32 << 20
        # Each mode a time of its own, so a row that reads the wrong mode shows in its ratio:
        # train-fused is PyTorch's fastest configuration, train-compile its leanest.
        for runs, mode, factor in ((minamp, "train-graph", 0.4), (pytorch, "train-fused", 0.5),
                                   (pytorch, "train-nchw", 1.3), (pytorch, "train-compile", 0.9)):
            for run in runs:
                if run["mode"] == mode:
                    run["step_ms"] = {k: v * factor for k, v in run["step_ms"].items()}
        for run in pytorch:
            if run["mode"] == "train-compile":
                run["peak_bytes"] = run["peak_bytes"] * 4 // 5
        # Before the library's f16 row: its f32 GEMM, a version's row and a sweep configuration.
        def row(shape, tflops, cublas, config=None, ab="f16"):
            r = {"shape": shape, "ab_dtype": ab, "c_dtype": ab, "m": 1, "n": 1, "k": 1,
                 "ratio": tflops / cublas, "minamp": {"tflops": tflops},
                 "cublas": {"tflops": cublas}, "check": {"max_rel_diff_vs_cublas": 1e-3}}
            return dict(r, config=config) if config else r
        gemm = {"rows": [
            row("square 4096", 45.0, 50.0, ab="f32"), row("square 4096", 300.0, 700.0, "v4"),
            row("square 4096", 70.0, 700.0, "v5 128x256x32, 8 warps of 64x64, 3 stages"),
            row("square 4096", 420.0, 700.0), row("square 1024", 100.0, 240.0),
            row("sine fwd", 200.0, 450.0),
            *([row("sine dgrad", 210.0, 450.0), row("sine wgrad", 180.0, 480.0)]
              if sine_gemms else []),
            # classify: conv3 is the slowest against v2 (0.9); the others are faster than v2.
            row("classify conv1", 3.0, 5.0), row("classify conv1", 2.0, 5.0, "v2"),
            row("classify conv2", 33.0, 46.0), row("classify conv2", 30.0, 46.0, "v2"),
            row("classify conv3", 45.0, 90.0), row("classify conv3", 50.0, 90.0, "v2"),
            row("classify conv4", 30.0, 60.0), row("classify conv4", 25.0, 60.0, "v2")]}
        if copy:  # device memory's copy rate, GB/s of bytes read and written
            gemm["copy"] = {"gb_per_s": 4000.0}
        if gemm_check_failed:  # bench_gemm writes no times or ratio for a failed check
            library = gemm["rows"][3]
            for key in ("ratio", "minamp", "cublas"):
                del library[key]
            library["check"] = {"ok": False}
        return Report(self, "gpu", minamp_result(minamp, 512), pytorch_result(pytorch, 512), gemm)

    def test_the_bounds_are_the_targets(self):
        bounds = {t["target"]: t["bound"] for t in self.gpu_report().combined()["targets"]}
        self.assertEqual(bounds["GEMM 4096^3 vs cublasGemmEx (TFLOP/s)"], 0.6)
        self.assertEqual(bounds["GEMM 1024^3 vs cublasGemmEx (TFLOP/s)"], 0.5)
        self.assertEqual(bounds["sine forward GEMM 262144x256x256 vs cublasGemmEx (TFLOP/s)"], 0.6)
        self.assertEqual(bounds["classify conv GEMMs, slowest library / v2 (TFLOP/s)"], 1.0)
        self.assertEqual(bounds["sine 512^2 AMP step vs the fastest PyTorch AMP configuration"],
                         0.6)
        self.assertEqual(bounds["classify AMP step vs the fastest PyTorch AMP configuration"], 0.5)
        # images/s at least 0.8 of PyTorch's: a step at most 1 / 0.8 of its.
        self.assertEqual(bounds["resnet50 AMP step vs the fastest PyTorch AMP configuration"],
                         1.25)
        self.assertEqual(
            bounds["resnet50 AMP peak memory vs the leanest PyTorch AMP configuration"], 1.0)
        self.assertEqual(
            bounds["sine 512^2 AMP peak memory vs the leanest PyTorch AMP configuration"], 0.7)
        self.assertEqual(bounds["mlp AMP step vs PyTorch eager AMP"], 0.2)
        self.assertEqual(bounds["sine 512^2 AMP peak memory vs minamp FP32"], 0.55)
        self.assertEqual(bounds["sine AMP final loss vs FP32 (last-10 mean)"], 0.05)
        self.assertEqual(bounds["mlp AMP final loss vs FP32 (last-10 mean)"], 0.05)
        self.assertEqual(bounds["sine 512^2 AMP-bf16 step vs minamp AMP-f16"], 1.05)
        self.assertEqual(bounds["sine 512^2 AMP-bf16 peak memory vs minamp FP32"], 0.55)
        self.assertEqual(bounds["sine AMP-bf16 final loss vs FP32 (last-10 mean)"], 0.05)

    def test_bf16_steps_are_compared_with_f16_steps_of_the_same_run(self):
        name = "sine 512^2 AMP-bf16 step vs minamp AMP-f16"
        target = self.gpu_report(bf16_factor=1.05).targets()[name]
        self.assertEqual((target["minamp"], target["reference"]), (4.2, 4.0))
        self.assertAlmostEqual(target["ratio"], 1.05)
        self.assertEqual(target["status"], "met")
        self.assertEqual(self.gpu_report(bf16_factor=1.1).targets()[name]["status"], "missed")

    def test_the_gemm_targets_read_the_library_f16_rows(self):
        targets = self.gpu_report().targets()
        square = targets["GEMM 4096^3 vs cublasGemmEx (TFLOP/s)"]
        self.assertEqual((square["minamp"], square["reference"], square["status"]),
                         (420.0, 700.0, "met"))
        small = targets["GEMM 1024^3 vs cublasGemmEx (TFLOP/s)"]
        self.assertEqual((small["minamp"], small["status"]), (100.0, "missed"))
        sine = targets["sine forward GEMM 262144x256x256 vs cublasGemmEx (TFLOP/s)"]
        self.assertEqual(sine["status"], "missed")

    def test_the_conv_target_takes_the_slowest_shape_against_v2(self):
        conv = self.gpu_report().targets()["classify conv GEMMs, slowest library / v2 (TFLOP/s)"]
        self.assertEqual((conv["minamp"], conv["reference"]), (45.0, 50.0))
        self.assertAlmostEqual(conv["ratio"], 0.9)
        self.assertEqual(conv["status"], "missed")

    def test_a_gemm_whose_check_failed_misses_rather_than_goes_unmeasured(self):
        report = self.gpu_report(gemm_check_failed=True)
        target = report.targets()["GEMM 4096^3 vs cublasGemmEx (TFLOP/s)"]
        self.assertEqual(target["status"], "missed (its result check failed)")

    def test_pairs_that_are_not_the_targets_are_info_even_inside_the_bound(self):
        report = self.gpu_report()
        self.assertEqual(report.process.returncode, 0, report.process.stderr)
        targets = report.targets()
        self.assertEqual(targets["mlp AMP step vs PyTorch eager AMP"]["status"], "met")
        name = "mlp AMP step replayed from a CUDA graph vs PyTorch eager AMP"
        self.assertAlmostEqual(targets[name]["ratio"], 0.02)
        self.assertEqual(targets[name]["status"], "info (not the target's pair)")

    def test_step_targets_take_pytorchs_fastest_configuration_and_name_it(self):
        report = self.gpu_report()
        targets = report.targets()
        sine = targets["sine 512^2 AMP step vs the fastest PyTorch AMP configuration"]
        self.assertEqual((sine["reference"], sine["reference_mode"]), (2.0, "train-fused"))
        self.assertEqual((sine["ratio"], sine["status"]), (2.0, "missed"))
        classify = targets["classify AMP step vs the fastest PyTorch AMP configuration"]
        self.assertEqual((classify["reference"], classify["ratio"]), (1.0, 2.0))
        memory = targets["sine 512^2 AMP peak memory vs the leanest PyTorch AMP configuration"]
        self.assertEqual(memory["reference_mode"], "train-compile")
        self.assertAlmostEqual(memory["ratio"], 1.25)
        resnet = targets["resnet50 AMP step vs the fastest PyTorch AMP configuration"]
        self.assertEqual((resnet["reference"], resnet["reference_mode"]), (20.0, "train-fused"))
        self.assertEqual((resnet["ratio"], resnet["status"]), (1.5, "missed"))
        resnet_memory = targets["resnet50 AMP peak memory vs the leanest PyTorch AMP configuration"]
        self.assertAlmostEqual(resnet_memory["ratio"], 1.25)
        self.assertEqual(resnet_memory["status"], "missed")
        with open(report.path("report.md")) as f:
            self.assertIn("2 ms (train-fused)", f.read())

    FLOOR = ("sine 512^2 AMP step vs its floor (GEMMs at cuBLAS's rate, 18 activation passes "
             "at the copy rate)")

    def test_the_sine_step_is_reported_against_its_floor(self):
        report = self.gpu_report()
        target = report.targets()[self.FLOOR]
        # Two 256-channel layers: each GEMM twice at cuBLAS's rate (fwd and dgrad 450, wgrad 480
        # TFLOP/s), and 18 passes over 512^2 x 256 f16 values at 4000 GB/s.
        gemm_ms = 2 * (2 * 512**2 * 256 * 256) * (1 / 450 + 1 / 450 + 1 / 480) / 1e12 * 1e3
        bytes_ms = 18 * 512**2 * 256 * 2 / 4000e9 * 1e3
        self.assertAlmostEqual(target["reference"], gemm_ms + bytes_ms)
        self.assertEqual(target["minamp"], 4.0)
        self.assertAlmostEqual(target["ratio"], 4.0 / (gemm_ms + bytes_ms))
        self.assertEqual(target["status"], "info (reported, no bound)")
        with open(report.path("report.md")) as f:
            self.assertIn("| none | info (reported, no bound) |", f.read())

    def test_the_floor_needs_the_copy_rate_and_every_sine_gemm(self):
        for report in (self.gpu_report(copy=False), self.gpu_report(sine_gemms=False)):
            target = report.targets()[self.FLOOR]
            self.assertIsNone(target["reference"])
            self.assertEqual(target["status"], "not measured")

    def test_pytorch_peaks_say_the_cublas_workspace_is_left_out(self):
        with open(self.gpu_report().path("report.md")) as f:
            text = f.read()
        self.assertIn("cuBLAS's workspace (32 MiB at most", text)
        self.assertIn("the -fused modes use fused=True", text)


class DepthFits(unittest.TestCase):
    """bench_gemm's depth rows fitted against K, from rows on known lines, in a report of
    bench_gemm's results alone."""

    @staticmethod
    def row(k, fixed_us, per_64_us, config=None, ab="f16"):
        ms = (fixed_us + per_64_us * k / 64) / 1000
        r = {"shape": f"sine fwd K={k}", "ab_dtype": ab, "c_dtype": ab, "m": 262144, "n": 256,
             "k": k, "ratio": 0.5, "minamp": {"median_ms": ms, "tflops": 1.0},
             "cublas": {"tflops": 2.0}, "check": {"ok": True, "max_rel_diff_vs_cublas": 1e-3}}
        return dict(r, config=config) if config else r

    def report(self):
        moments = "+ column moments"
        ks = (64, 128, 256, 512, 1024)
        rows = [self.row(k, 60.0, 20.0) for k in ks]
        rows += [self.row(k, 100.0, 21.0, moments) for k in ks]
        rows += [self.row(k, 50.0, 30.0, ab="bf16") for k in (64, 256)]
        rows.append(self.row(256, 40.0, 20.0, "v5 persistent 128x256x64"))  # one K: no fit
        rows.append({"shape": "square 4096", "ab_dtype": "f16", "c_dtype": "f16", "m": 4096,
                     "n": 4096, "k": 4096, "ratio": 0.5,
                     "minamp": {"median_ms": 0.4, "tflops": 340.0}, "cublas": {"tflops": 680.0},
                     "check": {"ok": True, "max_rel_diff_vs_cublas": 1e-3}})
        failed = next(r for r in rows if r.get("config") == moments and r["k"] == 512)
        for key in ("ratio", "minamp", "cublas"):  # a failed check: no time, not fitted
            del failed[key]
        failed["check"] = {"ok": False, "max_rel_diff_vs_cublas": None}
        report = Report(self, "gpu", None, None, {"rows": rows})
        self.assertEqual(report.process.returncode, 0, report.process.stderr)
        return report

    def test_each_configuration_is_fitted_to_its_line(self):
        fits = {(f["config"], f["ab_dtype"]): f for f in self.report().combined()["depth_fits"]}
        self.assertEqual(set(fits), {("library", "f16"), ("+ column moments", "f16"),
                                     ("library", "bf16")})
        for key, fixed, per_64, ks in (
                (("library", "f16"), 60.0, 20.0, [64, 128, 256, 512, 1024]),
                (("+ column moments", "f16"), 100.0, 21.0, [64, 128, 256, 1024]),
                (("library", "bf16"), 50.0, 30.0, [64, 256])):
            fit = fits[key]
            self.assertAlmostEqual(fit["fixed_us"], fixed, places=6)
            self.assertAlmostEqual(fit["per_64_k_us"], per_64, places=6)
            self.assertEqual(fit["k"], ks)
            self.assertAlmostEqual(fit["worst_fit_error"], 0.0, places=9)
            self.assertEqual(fit["shape"], "sine fwd")

    def test_a_point_off_the_line_shows_in_the_fit_error(self):
        rows = [self.row(k, 60.0, 20.0) for k in (64, 128, 256)]
        rows[1]["minamp"]["median_ms"] *= 1.5
        fit = Report(self, "gpu", None, None, {"rows": rows}).combined()["depth_fits"][0]
        self.assertGreater(fit["worst_fit_error"], 0.05)
        self.assertGreater(fit["fixed_us"], 60.0)

    def test_the_markdown_has_the_fits_and_the_models_are_listed_as_missing(self):
        report = self.report()
        with open(report.path("report.md")) as f:
            markdown = f.read()
        self.assertIn("| sine fwd | f16 | + column moments | 64, 128, 256, 1024 | 100 | 21 | 0.0% |",
                      markdown)
        self.assertNotIn("persistent", markdown.split("Time against K")[1])
        self.assertIn("minamp sine: no results", "; ".join(report.combined()["meta"]["missing"]))


class Provenance(unittest.TestCase):
    """Where the figures came from: the commit, marked -dirty with the changed files listed when
    git status in the folder report.py runs in shows a tracked file changed (untracked files do
    not count: results and build folders are new files)."""

    def git(self, repo, *argv):
        subprocess.run(["git", "-C", repo, *argv], check=True, capture_output=True)

    def meta(self, repo):
        minamp = every_run("minamp", {"mlp": 0.1, "sine": 30.0, "classify": 60.0}, peak=100)
        return Report(self, "cpu", minamp_result(minamp), None, cwd=repo).combined()["meta"]

    def test_a_changed_tracked_file_marks_the_commit_dirty_and_is_listed(self):
        if shutil.which("git") is None:
            self.skipTest("git is not installed")
        repo = tempfile.TemporaryDirectory()
        self.addCleanup(repo.cleanup)
        with open(os.path.join(repo.name, "tracked.txt"), "w") as f:
            f.write("one\n")
        self.git(repo.name, "init", "-q")
        self.git(repo.name, "add", "tracked.txt")
        self.git(repo.name, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
        with open(os.path.join(repo.name, "untracked.txt"), "w") as f:
            f.write("new\n")
        clean = self.meta(repo.name)
        self.assertEqual(clean["commit"], "abc1234")
        self.assertNotIn("changed_files", clean)
        with open(os.path.join(repo.name, "tracked.txt"), "w") as f:
            f.write("two\n")
        dirty = self.meta(repo.name)
        self.assertEqual(dirty["commit"], "abc1234-dirty")
        self.assertEqual(dirty["changed_files"], ["M tracked.txt"])


if __name__ == "__main__":
    unittest.main()
