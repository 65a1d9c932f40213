"""Test of bench/run-gpu.sh's plumbing without a GPU: the whole script runs on stand-in tools
(nvidia-smi, cmake, bench_train, bench_gemm, the examples and PyTorch's train.py, each writing
the files the real one writes, with made-up figures), and the test checks what the GPU session
depends on: every stage ran, the report lists nothing missing, and $OUT holds the four files the
device tool can return (it returns at most 8). Standard library only; ctest runs it as
bench.run_gpu.

The same file is the stand-in tools: `test_run_gpu.py --tool NAME ARGS...`."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest

from stand_ins import make_tool

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
GPU_NAME = "NVIDIA H100 80GB HBM3"


def option(args, name, default=None):
    return args[args.index(name) + 1] if name in args else default


def write_json(path, content):
    with open(path, "w") as f:
        json.dump(content, f)


def step_run(model, precision, mode, median_ms, train=True):
    run = {"model": model, "precision": precision, "mode": mode, "peak_bytes": 1 << 20,
           "step_ms": {"median": median_ms, "p10": median_ms, "p90": median_ms}}
    if train:
        run.update(final_loss=0.5, loss_last10_mean=0.5)
    return run


def fake_bench_train(args):
    runs = []
    for model in option(args, "--models").split(","):
        for precision in option(args, "--precisions", "fp32,amp").split(","):
            for mode in ("train", "infer", "train-graph"):
                runs.append(step_run(model, precision, mode, 1.0, mode != "infer"))
    write_json(option(args, "--json"), {"framework": "minamp", "threads": 16, "sine_size": 512,
                                        "seed": int(option(args, "--seed", 0)), "runs": runs,
                                        "models": {}})


def fake_bench_gemm(args):
    row = {"shape": "square 4096", "ab_dtype": "f16", "c_dtype": "f16", "m": 4096, "n": 4096,
           "k": 4096, "ratio": 0.6, "minamp": {"tflops": 400.0}, "cublas": {"tflops": 660.0},
           "check": {"max_rel_diff_vs_cublas": 1e-3}}
    write_json(option(args, "--json"), {"rows": [row], "wmma_sweep_skipped": []})


def fake_pytorch(args):
    modes = ("train", "infer", "train-fused") if "--fused" in args else ("train", "infer")
    runs = [step_run(option(args, "--models"), precision, mode, 2.0, mode != "infer")
            for precision in ("fp32", "amp") for mode in modes]
    write_json(option(args, "--json"), {"framework": "pytorch", "torch_version": "2.11.0",
                                        "threads": 16, "tf32_matmul": False, "tf32_cudnn": True,
                                        "sine_size": 512, "runs": runs, "models": {}})


def fake_example(args):
    for precision in ("fp32", "amp"):
        folder = os.path.join(option(args, "--out"), precision)
        os.makedirs(folder, exist_ok=True)
        for name in ("metrics.csv", "summary.json", "loss.png"):
            open(os.path.join(folder, name), "w").close()


def fake_cmake(args):
    """`cmake --build DIR ...` puts the stand-in programs into DIR; anything else succeeds."""
    if args[:1] != ["--build"]:
        return
    for program in ("bench_train", "bench_gemm", "sine", "mlp"):
        make_tool(os.path.join(args[1], program), program, __file__)


def fake_python(args):
    """The PYTHON of run-gpu.sh: bench/pytorch/train.py is the stand-in, the rest real."""
    if args and args[0].endswith("bench/pytorch/train.py"):
        return fake_pytorch(args[1:])
    os.execv(sys.executable, [sys.executable] + args)


def fake_nvidia_smi(args):
    """The name alone for --query-gpu=name (the results' file name), a CSV line otherwise."""
    print(GPU_NAME if "--query-gpu=name" in args else f"{GPU_NAME}, 580.159.04, 81559 MiB")


TOOLS = {"bench_train": fake_bench_train, "bench_gemm": fake_bench_gemm, "sine": fake_example,
         "mlp": fake_example, "cmake": fake_cmake, "python": fake_python,
         "nvidia-smi": fake_nvidia_smi}


class RunGpuScript(unittest.TestCase):
    def test_every_stage_reports_and_out_holds_four_files(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        bin_dir, build, out, results = (os.path.join(tmp.name, d)
                                        for d in ("bin", "build", "out", "results"))
        os.makedirs(bin_dir)
        os.makedirs(build)
        open(os.path.join(build, "build.ninja"), "w").close()  # configured: no configure stage
        for name in ("nvidia-smi", "cmake", "python"):
            make_tool(os.path.join(bin_dir, name), name, __file__)
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], BUILD=build,
                   OUT=out, RESULTS=results, COMMIT="abc1234", BUDGET_S="300",
                   PYTHON=os.path.join(bin_dir, "python"))
        process = subprocess.run(["bash", os.path.join(REPO, "bench", "run-gpu.sh")], env=env,
                                 capture_output=True, text=True, timeout=280)
        self.assertEqual(process.returncode, 0, process.stdout[-3000:] + process.stderr)
        self.assertNotIn("time budget is spent", process.stdout)
        self.assertEqual(process.stdout.count(": exit 0,"), 20, process.stdout[-3000:])

        files = sorted(os.path.relpath(os.path.join(folder, f), out)
                       for folder, _, names in os.walk(out) for f in names)
        self.assertEqual(len(files), 4, files)
        name = next(f for f in files if f.endswith(".json"))[:-len(".json")]
        self.addCleanup(shutil.rmtree, os.path.join("/tmp", name + "-parts"), True)
        self.assertTrue(name.startswith("gpu-h100-80gb-hbm3-") and name.endswith("-abc1234"))
        self.assertEqual(files, sorted(name + end for end in
                                       (".json", ".log", ".md", "-parts.tgz")))
        self.assertEqual(sorted(os.listdir(results)), [name + e for e in (".json", ".log", ".md")])
        with open(os.path.join(out, name + ".json")) as f:
            report = json.load(f)
        self.assertEqual(report["meta"]["missing"], [])
        statuses = {t["target"]: t["status"] for t in report["targets"]}
        self.assertEqual(statuses["WMMA GEMM 4096^3 vs cublasGemmEx (TFLOP/s)"], "met")
        self.assertEqual(statuses["mlp AMP step vs PyTorch eager AMP"], "missed")  # 1.0 / 2.0
        over_seeds = "sine AMP final loss vs FP32, mean over seeds 0, 1, 2, 3, 4, 5 (last-10 means)"
        self.assertEqual(statuses[over_seeds], "info (the target over seeds)")
        with tarfile.open(os.path.join(out, name + "-parts.tgz")) as parts:
            members = {os.path.relpath(m, name + "-parts") for m in parts.getnames()}
        for part in ("gemm-square-f16.json", "minamp-sine-amp.json", "pytorch-classify.json",
                     "sine/amp/summary.json", "mlp/fp32/metrics.csv",
                     "seeds/minamp-sine-seed5.json"):
            self.assertIn(part, members)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--tool"]:
        TOOLS[sys.argv[2]](sys.argv[3:])
    else:
        unittest.main()
