"""Test of bench/run-gpu.sh's plumbing without a GPU: the whole script runs on stand-in tools
(nvidia-smi, cmake, bench_train, bench_gemm, the examples and PyTorch's train.py, each writing
the files the real one writes, with made-up figures, and refusing an option or value the real one
refuses), and the test checks what a GPU run depends on: every stage ran, the report lists
nothing missing, and $OUT holds the four files the script promises;
a stage that hangs is cut to the run's time limit (TIME_LIMIT_S) and the later ones are skipped, the
report still written; a driver that refuses the compressed machine code at the first launch has
the build configured without compression and the benchmarks rebuilt before they run; MODELS
picks the models, and sine's other seeds run with sine, before the informational GEMM parts;
with nothing built the script fails. Standard library only; ctest runs it as bench.run_gpu.

The same file is the stand-in tools: `test_run_gpu.py --tool NAME ARGS...`."""

import glob
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest

from stand_ins import make_tool, option, step_run

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
GPU_NAME = "NVIDIA H100 80GB HBM3"


def one_of(*values):
    return lambda value: value in values


def list_of(*values):
    return lambda value: all(v in values for v in value.split(","))


def count(value):
    return value.isdigit()


# The options of the real programs (bench/train.cpp, bench/gemm.cu, examples/common.cpp) that
# run-gpu.sh passes, with the values they accept; None marks a flag.
OPTIONS = {
    "bench_train": {"--device": one_of("auto", "cpu", "cuda"),
                    "--models": list_of("mlp", "sine", "classify", "resnet50", "resnet50-frozen"),
                    "--precisions": list_of("fp32", "amp", "amp-bf16"), "--steps": count,
                    "--warmup": count,
                    "--infer-steps": count, "--profile": count, "--cuda-graph": None,
                    "--unfused": None,
                    "--size": count, "--seed": count, "--json": str},
    "bench_gemm": {"--shapes": one_of("all", "square", "model", "resnet50", "depth", "tiny"),
                   "--precisions": one_of("f16", "f32", "f16,f32", "f32,f16"),
                   "--json": str, "--sweep": None, "--no-versions": None},
    "example": {"--compare": None, "--compare-dtypes": None,
                "--device": one_of("auto", "cpu", "cuda"), "--out": str},
}


def check_options(tool, args):
    """Exits 2 (as CLI11 does) on an option or value the real tool refuses."""
    known, i = OPTIONS[tool], 0
    while i < len(args):
        name = args[i]
        if name not in known:
            sys.exit(f"{tool}: unknown option {name}")
        if known[name] is not None:
            if i + 1 == len(args) or not known[name](args[i + 1]):
                sys.exit(f"{tool}: bad value for {name}: {args[i + 1:i + 2]}")
            i += 1
        i += 1


def write_json(path, content):
    with open(path, "w") as f:
        json.dump(content, f)


def fake_bench_train(args):
    check_options("bench_train", args)
    if os.environ.get("FAKE_HANG") == option(args, "--models"):
        time.sleep(600)
    runs = []
    for model in option(args, "--models").split(","):
        for precision in option(args, "--precisions", "fp32,amp,amp-bf16").split(","):
            for mode in ("train", "infer", "train-graph", "train-unfused"):
                runs.append(step_run(model, precision, mode, 1.0, mode != "infer"))
    write_json(option(args, "--json"), {"framework": "minamp", "threads": 16, "sine_size": 512,
                                        "seed": int(option(args, "--seed", 0)), "runs": runs,
                                        "models": {}})


def fake_bench_gemm(args):
    """The first launch (--shapes tiny, no JSON) fails under FAKE_REFUSES_COMPRESSED until cmake
    has configured the build without compression; the other parts write their JSON."""
    check_options("bench_gemm", args)
    if option(args, "--shapes") == "tiny":
        with open(os.environ["FAKE_CMAKE_LOG"]) as f:
            uncompressed = "-DMINAMP_CUDA_COMPRESS_FOR_SIZE=OFF" in f.read()
        if os.environ.get("FAKE_REFUSES_COMPRESSED") and not uncompressed:
            sys.exit("bench_gemm: CUDA error cudaErrorInvalidKernelImage (device kernel image "
                     "is invalid)")
        return
    row = {"shape": "square 4096", "ab_dtype": "f16", "c_dtype": "f16", "m": 4096, "n": 4096,
           "k": 4096, "ratio": 0.6, "minamp": {"tflops": 400.0}, "cublas": {"tflops": 660.0},
           "check": {"max_rel_diff_vs_cublas": 1e-3}}
    write_json(option(args, "--json"), {"rows": [row], "sweep_skipped": []})


def fake_pytorch(args):
    configs = [c for c in (option(args, "--configs") or "").split(",") if c]
    modes = ("train", "infer") + tuple("train-" + c for c in configs)
    runs = [step_run(option(args, "--models"), precision, mode, 2.0, mode != "infer")
            for precision in ("fp32", "amp", "amp-bf16") for mode in modes]
    write_json(option(args, "--json"), {"framework": "pytorch", "torch_version": "2.11.0",
                                        "threads": 16, "tf32_matmul": False, "tf32_cudnn": True,
                                        "sine_size": 512, "runs": runs, "models": {}})


def fake_example(args):
    check_options("example", args)
    both = "--compare-dtypes" in args
    for precision in ("fp32", "amp") + (("amp-bf16",) if both else ()):
        folder = os.path.join(option(args, "--out"), precision)
        os.makedirs(folder, exist_ok=True)
        for name in ("metrics.csv", "summary.json", "loss.png"):
            open(os.path.join(folder, name), "w").close()


def fake_cmake(args):
    """`cmake --build DIR ...` puts the stand-in programs into DIR; anything else succeeds. Each
    call's arguments are appended to $FAKE_CMAKE_LOG."""
    with open(os.environ["FAKE_CMAKE_LOG"], "a") as f:
        f.write(" ".join(args) + "\n")
    if args[:1] != ["--build"] or os.environ.get("FAKE_NO_BUILD"):
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
    def run_script(self, limit_s=300, **failures):
        """Runs bench/run-gpu.sh on the stand-ins (`failures` added to its environment); returns
        the process and the OUT and RESULTS folders."""
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        bin_dir, build, out, results = (os.path.join(tmp.name, d)
                                        for d in ("bin", "build", "out", "results"))
        os.makedirs(bin_dir)
        os.makedirs(build)
        open(os.path.join(build, "build.ninja"), "w").close()  # configured: no configure stage
        for name in ("nvidia-smi", "cmake", "python"):
            make_tool(os.path.join(bin_dir, name), name, __file__)
        self.cmake_log = os.path.join(tmp.name, "cmake.log")
        open(self.cmake_log, "w").close()
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], BUILD=build,
                   OUT=out, RESULTS=results, COMMIT="abc1234", TIME_LIMIT_S=str(limit_s),
                   TMPDIR=tmp.name, PYTHON=os.path.join(bin_dir, "python"),
                   FAKE_CMAKE_LOG=self.cmake_log, **failures)
        process = subprocess.run(["bash", os.path.join(REPO, "bench", "run-gpu.sh")], env=env,
                                 capture_output=True, text=True, timeout=280)
        return process, out, results

    def test_every_stage_reports_and_out_holds_four_files(self):
        process, out, results = self.run_script()
        self.assertEqual(process.returncode, 0, process.stdout[-3000:] + process.stderr)
        self.assertNotIn("time limit is spent", process.stdout)
        self.assertEqual(process.stdout.count(": exit 0,"), 34, process.stdout[-3000:])
        self.assertIn("first launch: the GEMM kernels ran; this driver loads the machine code",
                      process.stdout)

        files = sorted(os.path.relpath(os.path.join(folder, f), out)
                       for folder, _, names in os.walk(out) for f in names)
        self.assertEqual(len(files), 4, files)
        name = next(f for f in files if f.endswith(".json"))[:-len(".json")]
        self.assertTrue(name.startswith("gpu-h100-80gb-hbm3-") and name.endswith("-abc1234"))
        self.assertEqual(files, sorted(name + end for end in
                                       (".json", ".log", ".md", "-parts.tgz")))
        self.assertEqual(sorted(os.listdir(results)), [name + e for e in (".json", ".log", ".md")])
        with open(os.path.join(out, name + ".json")) as f:
            report = json.load(f)
        self.assertEqual(report["meta"]["missing"], [])
        statuses = {t["target"]: t["status"] for t in report["targets"]}
        self.assertEqual(statuses["GEMM 4096^3 vs cublasGemmEx (TFLOP/s)"], "met")
        self.assertEqual(statuses["mlp AMP step vs PyTorch eager AMP"], "missed")  # 1.0 / 2.0
        self.assertEqual(statuses["resnet50 AMP step vs the fastest PyTorch AMP configuration"],
                         "met")  # 1.0 / 2.0 against a bound of 1.25
        over_seeds = "sine AMP final loss vs FP32, mean over seeds 0, 1, 2, 3, 4, 5 (last-10 means)"
        self.assertEqual(statuses[over_seeds], "info (the target over seeds)")
        bf16_seeds = over_seeds.replace("sine AMP", "sine AMP-bf16")
        self.assertEqual(statuses[bf16_seeds], "met")
        with tarfile.open(os.path.join(out, name + "-parts.tgz")) as parts:
            members = {os.path.relpath(m, name + "-parts") for m in parts.getnames()}
        for part in ("gemm-square-f16.json", "minamp-sine-amp.json", "minamp-sine-amp-bf16.json",
                     "pytorch-classify.json", "minamp-resnet50-frozen-amp.json",
                     "pytorch-resnet50.json", "sine/amp/summary.json",
                     "sine/amp-bf16/summary.json", "mlp/fp32/metrics.csv",
                     "seeds/minamp-sine-seed5.json"):
            self.assertIn(part, members)

    def test_a_driver_that_refuses_compressed_code_gets_the_benchmarks_rebuilt_first(self):
        process, out, results = self.run_script(MODELS="sine", FAKE_REFUSES_COMPRESSED="1")
        self.assertEqual(process.returncode, 0, process.stdout[-3000:] + process.stderr)
        self.assertRegex(process.stdout, r"-- first launch: exit 0,")
        with open(self.cmake_log) as f:
            calls = f.read().splitlines()
        build_benches = [c for c in calls if c.startswith("--build ")]
        self.assertEqual(len(build_benches), 2, calls)  # the build stage's, then the rebuild
        self.assertIn("-DMINAMP_CUDA_COMPRESS_FOR_SIZE=OFF", calls[1], calls)
        self.assertEqual(calls[2], build_benches[1], calls)
        self.assertLess(process.stdout.index("-- first launch: exit 0,"),
                        process.stdout.index("== bench_gemm square-f16"))
        [path] = glob.glob(os.path.join(results, "gpu-*.json"))
        with open(path) as f:
            self.assertNotIn("bench_gemm: no results", json.load(f)["meta"]["missing"])

    def test_a_stage_that_hangs_is_cut_to_the_time_limit_and_the_rest_skipped(self):
        start = time.monotonic()
        process, out, results = self.run_script(limit_s=35, FAKE_HANG="mlp")
        self.assertLess(time.monotonic() - start, 35, "the time limit was overrun")
        self.assertEqual(process.returncode, 0, process.stdout[-3000:] + process.stderr)
        limits = re.findall(r"^== bench_train mlp fp32 \(limit (\d+) s\)$", process.stdout,
                            re.MULTILINE)
        self.assertEqual(len(limits), 1, process.stdout[-3000:])
        self.assertLessEqual(int(limits[0]), 15)
        self.assertRegex(process.stdout, r"-- bench_train mlp fp32: exit 124,")
        self.assertIn("== bench_train sine seed 5: skipped, the run's time limit is spent",
                      process.stdout)
        [path] = glob.glob(os.path.join(results, "gpu-*.json"))
        with open(path) as f:
            missing = json.load(f)["meta"]["missing"]
        self.assertIn("minamp mlp: no results", missing)
        self.assertNotIn("bench_gemm: no results", missing)  # the stage before it ran

    def test_models_picks_the_models_that_run(self):
        process, out, results = self.run_script(MODELS="sine resnet50")
        self.assertEqual(process.returncode, 0, process.stdout[-3000:] + process.stderr)
        ran = set(re.findall(r"^== bench_train (\S+) fp32 ", process.stdout, re.MULTILINE))
        self.assertEqual(ran, {"sine", "resnet50"})
        self.assertNotIn("== pytorch mlp", process.stdout)
        [path] = glob.glob(os.path.join(results, "gpu-*.json"))
        with open(path) as f:
            missing = json.load(f)["meta"]["missing"]
        self.assertIn("minamp mlp: no results", missing)
        # sine's other seeds (a target's) come before the informational GEMM parts
        self.assertLess(process.stdout.index("== bench_train sine seed 5"),
                        process.stdout.index("== bench_gemm resnet50-f16"))

        process, _, _ = self.run_script(MODELS="classify")
        self.assertEqual(process.returncode, 0, process.stdout[-3000:] + process.stderr)
        self.assertNotIn("sine seed", process.stdout)

        process, _, _ = self.run_script(MODELS="sine resnet")
        self.assertEqual(process.returncode, 2)
        self.assertIn("MODELS names 'resnet', not one of:", process.stderr)

    def test_with_nothing_built_it_fails_and_writes_no_report(self):
        process, out, results = self.run_script(FAKE_NO_BUILD="1")
        self.assertEqual(process.returncode, 1, process.stdout[-3000:] + process.stderr)
        self.assertIn("neither bench_train nor bench_gemm was built; nothing to run",
                      process.stdout)
        self.assertFalse(os.path.exists(results) and os.listdir(results))
        self.assertEqual(sorted(f[-4:] for f in os.listdir(out)), [".log", ".tgz"])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--tool"]:
        TOOLS[sys.argv[2]](sys.argv[3:])
    else:
        unittest.main()
