"""Test of bench/check-predictions.sh's plumbing without a GPU: the script runs in a copy of the
repository's layout whose scripts/gpu-check.sh, bench/run-gpu.sh, bench/profile-gpu.sh and
bench/report.py are stand-ins, as are the build's minamp_tests, bench_gemm and bench_train; each
stand-in records how it was called (its arguments and the environment the script sets) and writes
a file of the kind the real one writes. The test checks: the stages run in order with the options
and variables that pick the predictions' runs; each script is given a time limit within its stage's
and the benchmark one that ends by BENCH_UNTIL_S; a failing stage leaves the later ones to run and
fails the run; a hanging stage is cut to its limit and the whole run keeps to TIME_LIMIT_S; $OUT
holds one archive of the stages' files, packed after every stage, and the output shows the tables
the predictions are read from. Standard library only; ctest runs
it as bench.check_predictions.

A second test runs the script on the real scripts, with the stand-in tools of their own tests
(nvidia-smi, cmake, cuobjdump, ncu, the build's programs and PyTorch's train.py), and checks that
every stage passes and the archive holds each script's files: what the scripts hand one another
(the build folder, $OUT, the time limits, MODELS, PROFILES) works as one command.

The same file is the stand-in tools: `test_check_predictions.py --tool NAME ARGS...` for the
first test's (FAKE_FAIL and FAKE_HANG name the one that fails or hangs), `--real-scripts-tool
NAME ARGS...` for the second's."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest

from stand_ins import make_tool, option

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

# The stand-ins: where each lives in the copied tree (scripts run with bash, the build's programs
# and report.py directly) and the file it writes (relative to $OUT or named by an option).
SCRIPTS = {"gpu-check": "scripts/gpu-check.sh", "run-gpu": "bench/run-gpu.sh",
           "profile-gpu": "bench/profile-gpu.sh"}
PROGRAMS = ("minamp_tests", "bench_gemm", "bench_train")


def record(name, args):
    """Appends this call to $FAKE_CALLS; fails or hangs when FAKE_FAIL / FAKE_HANG name it."""
    keys = ("ONLY", "MODELS", "PROFILES", "TIME_LIMIT_S", "OUT", "COMMIT", "BUILD",
            "MINAMP_GEMM_PERSISTENT")
    call = {"tool": name, "args": args, "env": {k: os.environ[k] for k in keys if k in os.environ}}
    with open(os.environ["FAKE_CALLS"], "a") as f:
        f.write(json.dumps(call) + "\n")
    if os.environ.get("FAKE_HANG") == name:
        time.sleep(600)
    if os.environ.get("FAKE_FAIL") == name:
        sys.exit(f"{name}: failed")


def write(path, text="made up\n"):
    with open(path, "w") as f:
        f.write(text)


def fake_tool(name, args):
    record(name, args)
    out = os.environ.get("OUT", "")
    if name == "gpu-check":
        for log in ("setup.log", "build.log"):
            write(os.path.join(out, log))
        write(os.path.join(out, "sass.json"), "[]\n")
    elif name == "run-gpu":
        write(os.path.join(out, "gpu-h200-x.json"), "{}\n")
        write(os.path.join(out, "gpu-h200-x.md"), "| sine AMP step | 1.9 ms |\n")
    elif name == "profile-gpu":
        write(os.path.join(out, "ncu-h200-x.md"), "| gemm_v5_kernel | 200 |\n")
    elif name in ("bench_gemm", "bench_train"):
        write(option(args, "--json"), "{}\n")
    elif name == "report.py":
        write(option(args, "--out"), "{}\n")
        write(option(args, "--markdown"), "| K | µs |\n")
    print(f"{name} ran")


def verdicts(process):
    """The summary's stage: verdict lines, without their durations."""
    summary = process.stdout[process.stdout.find("== summary"):]
    return dict(re.findall(r"^  (\S+)\s+(\S.*?)(?:, \d+ s)?$", summary, re.MULTILINE))


class CheckPredictionsScript(unittest.TestCase):
    def run_script(self, limit_s=120, bench_until_s=80, **failures):
        """Runs check-predictions.sh in a copied tree on the stand-ins; returns the process and
        the calls the stand-ins recorded."""
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        tree, self.out = os.path.join(tmp.name, "tree"), os.path.join(tmp.name, "out")
        for folder in ("bench", "scripts", "build-gpu"):
            os.makedirs(os.path.join(tree, folder))
        for path in ("bench/check-predictions.sh", "scripts/args.sh", "scripts/run-names.sh"):
            shutil.copy(os.path.join(REPO, path), os.path.join(tree, path))
        for name, path in SCRIPTS.items():
            make_tool(os.path.join(tree, path), name, __file__)
        for name in PROGRAMS:
            make_tool(os.path.join(tree, "build-gpu", name), name, __file__)
        make_tool(os.path.join(tree, "bench", "report.py"), "report.py", __file__)
        calls = os.path.join(tmp.name, "calls.jsonl")
        env = dict(os.environ, OUT=self.out, COMMIT="abc1234", TIME_LIMIT_S=str(limit_s),
                   BENCH_UNTIL_S=str(bench_until_s), PYTHON="bash", FAKE_CALLS=calls,
                   TMPDIR=tmp.name, **failures)
        env.pop("BUILD", None)
        process = subprocess.run(["bash", os.path.join(tree, "bench", "check-predictions.sh")],
                                 env=env, capture_output=True, text=True, timeout=200)
        with open(calls) if os.path.exists(calls) else open(os.devnull) as f:
            return process, [json.loads(line) for line in f]

    def test_the_stages_run_in_order_with_the_predictions_options(self):
        process, calls = self.run_script()
        self.assertEqual(process.returncode, 0, process.stdout + process.stderr)
        self.assertEqual(verdicts(process),
                         dict.fromkeys(("build_sass", "tests", "bench", "profile", "depth",
                                        "persistent"), "pass"))
        self.assertEqual([c["tool"] for c in calls],
                         ["gpu-check", "minamp_tests", "run-gpu", "profile-gpu", "bench_gemm",
                          "report.py", "bench_train"])
        check, tests, bench, profile, depth, report, persistent = calls
        self.assertEqual(check["env"]["ONLY"], "sass")
        self.assertEqual(tests["args"],
                         ["--gtest_filter=Gpu*:-GpuExamples.*:GpuBatchNorm.Large*"])
        self.assertEqual(bench["env"]["MODELS"], "sine classify")
        self.assertEqual(os.path.basename(bench["env"]["OUT"]), "bench")
        self.assertEqual(profile["env"]["PROFILES"], "sine-step gemm-loop")
        self.assertEqual(option(depth["args"], "--shapes"), "depth")
        self.assertIn("--sweep", depth["args"])
        self.assertEqual(option(report["args"], "--gemm"), option(depth["args"], "--json"))
        self.assertEqual(persistent["env"]["MINAMP_GEMM_PERSISTENT"], "1")
        self.assertEqual(option(persistent["args"], "--precisions"), "amp")
        for call in calls:
            self.assertEqual(call["env"].get("COMMIT"), "abc1234", call)
            self.assertEqual(call["env"].get("BUILD"), "build-gpu", call)
        # Each script keeps within the limit it is given: within its stage's, and the benchmark's
        # ends by BENCH_UNTIL_S (80 s into the run).
        self.assertLessEqual(int(check["env"]["TIME_LIMIT_S"]), 330 - 5)
        self.assertLessEqual(int(bench["env"]["TIME_LIMIT_S"]), 80 - 5)
        self.assertGreater(int(bench["env"]["TIME_LIMIT_S"]), 60)
        self.assertLessEqual(int(profile["env"]["TIME_LIMIT_S"]), 90 - 5)

        self.assertEqual(os.listdir(self.out), ["predictions.tgz"])
        self.assertEqual(self.archived(),
                         ["bench", "bench/gpu-h200-x.json", "bench/gpu-h200-x.md", "build.log",
                          "check.txt", "depth-report.json", "depth-report.md", "depth.json",
                          "depth.txt", "ncu-h200-x.md", "persistent.json", "persistent.txt",
                          "profile.txt", "sass.json", "setup.log", "tests.txt"])
        tables = process.stdout[:process.stdout.index("== summary")]
        for table in ("== bench/gpu-h200-x.md\n| sine AMP step | 1.9 ms |",
                      "== ncu-h200-x.md\n| gemm_v5_kernel | 200 |",
                      "== depth-report.md\n| K | µs |"):
            self.assertIn(table, tables)

    def archived(self):
        """The files and folders in $OUT/predictions.tgz, without the leading ./"""
        with tarfile.open(os.path.join(self.out, "predictions.tgz")) as archive:
            return sorted(os.path.normpath(n) for n in archive.getnames() if n != ".")

    def test_a_failing_stage_leaves_the_later_ones_to_run_and_fails_the_run(self):
        process, calls = self.run_script(FAKE_FAIL="minamp_tests")
        self.assertEqual(process.returncode, 1, process.stdout + process.stderr)
        stages = verdicts(process)
        self.assertEqual(stages["tests"], "FAIL (exit 1)")
        self.assertEqual({stages[s] for s in ("build_sass", "bench", "persistent")}, {"pass"})
        self.assertEqual(calls[-1]["tool"], "bench_train")

    def test_a_hanging_stage_is_cut_and_the_run_keeps_to_its_limit(self):
        start = time.monotonic()
        process, calls = self.run_script(limit_s=45, bench_until_s=20, FAKE_HANG="run-gpu")
        self.assertLess(time.monotonic() - start, 45, "the time limit was overrun")
        self.assertEqual(process.returncode, 1, process.stdout + process.stderr)
        stages = verdicts(process)
        self.assertRegex(stages["bench"], r"^TIMEOUT after (1\d|20) s$")
        self.assertEqual(stages["build_sass"], "pass")
        self.assertEqual(stages["profile"], "pass")  # 45 - 10 - ~20 s left for it
        self.assertIn("== summary", process.stdout)
        self.assertIn("tests.txt", self.archived())  # the stages before the hang

    def test_it_refuses_a_time_limit_that_is_not_whole_seconds(self):
        process, calls = self.run_script(limit_s="9m")
        self.assertEqual(process.returncode, 2)
        self.assertIn("TIME_LIMIT_S and BENCH_UNTIL_S take whole seconds, got '9m'",
                      process.stderr)
        self.assertEqual(calls, [])


def real_scripts_tool(name, args):
    """The stand-ins of the scripts' own tests, as one set: cmake configures a build folder (its
    build.ninja) and `cmake --build $BUILD` puts the build's programs and GEMM objects there;
    bench_gemm lists its kernels as gpu-check's test has it, passes its first launch, and writes
    its tables as run-gpu's test has it."""
    import test_gpu_check
    import test_profile_gpu
    import test_run_gpu
    build = os.environ["BUILD"]
    if name == "cmake":
        if option(args, "-B") == build:
            os.makedirs(build, exist_ok=True)
            open(os.path.join(build, "build.ninja"), "w").close()
        if args[:2] == ["--build", build]:
            for program in ("minamp_tests", "bench_gemm", "bench_train", "sine", "mlp"):
                make_tool(os.path.join(build, program), program, __file__, "--real-scripts-tool")
            objects = os.path.join(build, "CMakeFiles", "minamp.dir", "cuda")
            os.makedirs(objects, exist_ok=True)
            for gemm_object in ("gemm_v1_fake.cu.o", "gemm_fp32.cu.o"):
                open(os.path.join(objects, gemm_object), "w").close()
        return
    if name == "bench_gemm" and args == ["--kernels"]:
        return test_gpu_check.fake_bench_gemm(args)
    if name == "bench_gemm" and option(args, "--shapes") == "tiny":
        return print("square 64 (64x64x64)  f16  0.00  0.00  33.3%")
    tools = {**test_gpu_check.TOOLS, "ncu": test_profile_gpu.fake_ncu, **test_run_gpu.TOOLS}
    tools[name](args)


class CheckPredictionsOnTheRealScripts(unittest.TestCase):
    def test_every_stage_passes_and_the_archive_holds_each_scripts_files(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        bin_dir, build, out = (os.path.join(tmp.name, d) for d in ("bin", "build", "out"))
        os.makedirs(bin_dir)
        for name in ("nvidia-smi", "cmake", "cuobjdump", "ncu", "python"):
            make_tool(os.path.join(bin_dir, name), name, __file__, "--real-scripts-tool")
        results = os.path.join(tmp.name, "results")
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], BUILD=build,
                   OUT=out, COMMIT="abc1234", RESULTS=results, TMPDIR=tmp.name,
                   PYTHON=os.path.join(bin_dir, "python"))
        process = subprocess.run(["bash", os.path.join(REPO, "bench", "check-predictions.sh")],
                                 env=env, capture_output=True, text=True, timeout=280)
        self.assertEqual(process.returncode, 0, process.stdout[-4000:] + process.stderr)
        self.assertIn("== summary", process.stdout)
        self.assertEqual(verdicts(process), dict.fromkeys(
            ("build_sass", "tests", "bench", "profile", "depth", "persistent"), "pass"))
        self.assertEqual(os.listdir(out), ["predictions.tgz"])
        with tarfile.open(os.path.join(out, "predictions.tgz")) as archive:
            names = {os.path.normpath(n) for n in archive.getnames()}
        for name in ("check.txt", "setup.log", "build.log", "sass.json", "tests.txt",
                     "profile.txt", "depth.json", "depth-report.md", "persistent.json"):
            self.assertIn(name, names)
        bench_files = {os.path.basename(n) for n in names if n.startswith("bench/")}
        self.assertEqual({re.sub(r"^gpu-h100-80gb-hbm3-\d{8}-\d{4}-abc1234", "", f)
                          for f in bench_files},
                         {".json", ".log", ".md", "-parts.tgz"}, bench_files)
        self.assertTrue(any(n.startswith("ncu-") and n.endswith(".md") for n in names), names)
        # run-gpu.sh measured sine and classify (and the seeds), not the other models
        [report] = glob.glob(os.path.join(results, "gpu-*.json"))
        with open(report) as f:
            missing = json.load(f)["meta"]["missing"]
        self.assertIn("minamp mlp: no results", missing)
        self.assertFalse([m for m in missing if "sine" in m or "classify" in m], missing)
        self.assertIn("== bench/gpu-h100-80gb-hbm3-", process.stdout)  # its table, shown


if __name__ == "__main__":
    if sys.argv[1:2] == ["--tool"]:
        fake_tool(sys.argv[2], sys.argv[3:])
    elif sys.argv[1:2] == ["--real-scripts-tool"]:
        real_scripts_tool(sys.argv[2], sys.argv[3:])
    else:
        unittest.main()
