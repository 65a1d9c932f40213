"""Test of bench/run-cpu.sh (`make bench`) without building or installing anything: the whole
script runs on stand-in tools (cmake, bench_train, PyTorch's virtual environment, and python3 for
the case where that environment cannot be made), each writing the files the real one writes,
with made-up figures, and logging how it was called. The test checks what `make bench` promises:
every model in both frameworks with the same thread count, sine again from five seeds, and the
report under RESULTS; without PyTorch, the minamp half with the reason; a bench_train that fails
is an error with no report. Standard library only; ctest runs it as bench.run_cpu.

The same file is the stand-in tools: `test_run_cpu.py --tool NAME ARGS...`."""

import glob
import json
import os
import subprocess
import sys
import tempfile
import unittest

from stand_ins import make_tool, option, step_run

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))


def log_call(name, args):
    """One line per call in $CALLS: the tool, OMP_NUM_THREADS and the arguments."""
    with open(os.environ["CALLS"], "a") as f:
        f.write(json.dumps({"tool": name, "omp": os.environ.get("OMP_NUM_THREADS"),
                            "args": args}) + "\n")


def write_result(args, framework, median_ms, **extra):
    precisions = option(args, "--precisions", "fp32,amp,amp-bf16").split(",")
    runs = [step_run(option(args, "--models"), p, mode, median_ms, mode == "train")
            for p in precisions for mode in ("train", "infer")]
    with open(option(args, "--json"), "w") as f:
        json.dump(dict(framework=framework, threads=int(os.environ["OMP_NUM_THREADS"]),
                       sine_size=int(option(args, "--size", 64)), runs=runs, models={},
                       **extra), f)


def fake_bench_train(args):
    log_call("bench_train", args)
    if option(args, "--models") == os.environ.get("FAIL_MODEL"):
        sys.exit("bench_train: made to fail")
    write_result(args, "minamp", 1.0, seed=int(option(args, "--seed", 0)))


def fake_venv_python(args):
    """The virtual environment's python: torch imports, and bench/pytorch/train.py writes."""
    if args[:1] == ["-c"]:
        return
    log_call("pytorch", args[1:])
    write_result(args[1:], "pytorch", 2.0, torch_version="2.11.0", tf32_matmul=False,
                 tf32_cudnn=False)


def fake_python3(args):
    """python3 on PATH that cannot make a virtual environment (no network); the rest real."""
    if args[:2] == ["-m", "venv"]:
        sys.exit("venv: made to fail")
    os.execv(sys.executable, [sys.executable] + args)


def fake_cmake(args):
    """`cmake --build DIR --target bench_train ...` puts the stand-in bench_train into DIR."""
    log_call("cmake", args)
    make_tool(os.path.join(args[1], "bench_train"), "bench_train", __file__)


TOOLS = {"bench_train": fake_bench_train, "venv-python": fake_venv_python,
         "python3": fake_python3, "cmake": fake_cmake}


class RunCpuScript(unittest.TestCase):
    def run_script(self, with_torch=True, fail_model=""):
        """Runs bench/run-cpu.sh on the stand-ins with 3 threads; returns the process, the
        calls the tools saw, and the RESULTS folder."""
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        bin_dir, build, venv, results = (os.path.join(tmp.name, d)
                                         for d in ("bin", "build", "venv", "results"))
        calls = os.path.join(tmp.name, "calls.jsonl")
        os.makedirs(bin_dir)
        os.makedirs(build)
        make_tool(os.path.join(bin_dir, "cmake"), "cmake", __file__)
        if with_torch:
            os.makedirs(os.path.join(venv, "bin"))
            make_tool(os.path.join(venv, "bin", "python"), "venv-python", __file__)
        else:
            make_tool(os.path.join(bin_dir, "python3"), "python3", __file__)
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], VENV=venv,
                   RESULTS=results, COMMIT="abc1234", BENCH_THREADS="3", CALLS=calls,
                   FAIL_MODEL=fail_model)
        process = subprocess.run(["bash", os.path.join(REPO, "bench", "run-cpu.sh"), build],
                                 env=env, capture_output=True, text=True, timeout=120)
        with open(calls) as f:
            return process, [json.loads(line) for line in f], results

    def report(self, results):
        [path] = glob.glob(os.path.join(results, "cpu-*-abc1234.json"))
        name = os.path.basename(path)[:-len(".json")]
        self.assertEqual(sorted(os.listdir(results)), [name + e for e in (".json", ".log", ".md")])
        with open(path) as f:
            return json.load(f)

    def test_both_frameworks_run_every_model_with_the_same_threads(self):
        process, calls, results = self.run_script()
        self.assertEqual(process.returncode, 0, process.stdout[-3000:] + process.stderr)
        self.assertEqual({c["omp"] for c in calls}, {"3"})
        self.assertEqual(calls[0]["args"][:4], ["--build", calls[0]["args"][1], "--target",
                                                "bench_train"])
        minamp = [c["args"] for c in calls if c["tool"] == "bench_train"]
        pytorch = [c["args"] for c in calls if c["tool"] == "pytorch"]
        self.assertEqual([option(a, "--models") for a in minamp],
                         ["mlp", "sine", "classify", "resnet18"] + ["sine"] * 5)
        self.assertEqual([option(a, "--seed") for a in minamp[4:]], ["1", "2", "3", "4", "5"])
        self.assertTrue(all(option(a, "--size") == "64" for a in minamp if "sine" in a))
        self.assertEqual([(option(a, "--models"), option(a, "--precisions")) for a in pytorch],
                         [(m, p) for m in ("mlp", "sine", "classify", "resnet18")
                          for p in ("fp32", "amp", "amp-bf16")])
        self.assertEqual({option(a, "--threads") for a in pytorch}, {"3"})
        # The FP32 runs, which the targets compare, take the steps minamp takes.
        for model in ("mlp", "sine", "classify", "resnet18"):
            ours = next(a for a in minamp if option(a, "--models") == model)
            theirs = next(a for a in pytorch if option(a, "--models") == model)
            self.assertEqual(option(ours, "--steps"), option(theirs, "--steps"), model)

        report = self.report(results)
        self.assertEqual(report["meta"]["missing"], [])
        self.assertEqual(report["meta"]["pytorch_status"], "ran")
        statuses = {t["target"]: t["status"] for t in report["targets"]}
        self.assertEqual(statuses["mlp FP32 step vs PyTorch CPU eager FP32"], "met")  # 1.0 / 2.0
        over_seeds = "sine AMP final loss vs FP32, mean over seeds 0, 1, 2, 3, 4, 5 (last-10 means)"
        self.assertIn(over_seeds, statuses)

    def test_without_pytorch_the_minamp_half_is_written_with_the_reason(self):
        process, calls, results = self.run_script(with_torch=False)
        self.assertEqual(process.returncode, 0, process.stdout[-3000:] + process.stderr)
        self.assertIn("torch could not be installed from PyPI", process.stdout)
        self.assertFalse([c for c in calls if c["tool"] == "pytorch"])
        report = self.report(results)
        self.assertIn("torch could not be installed", report["meta"]["pytorch_status"])
        statuses = {t["target"]: t["status"] for t in report["targets"]}
        self.assertEqual(statuses["mlp FP32 step vs PyTorch CPU eager FP32"], "not measured")
        self.assertEqual(statuses["mlp AMP final loss vs FP32 (last-10 mean)"], "met")

    def test_a_failing_bench_train_is_an_error_with_no_report(self):
        process, calls, results = self.run_script(fail_model="sine")
        self.assertNotEqual(process.returncode, 0)
        self.assertIn("bench: bench_train failed on sine; nothing to report", process.stdout)
        self.assertFalse([c for c in calls if option(c["args"], "--models") == "classify"])
        self.assertEqual([f for f in os.listdir(results) if not f.endswith(".log")], [])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--tool"]:
        TOOLS[sys.argv[2]](sys.argv[3:])
    else:
        unittest.main()
