"""Test of scripts/gpu-check.sh's plumbing without a GPU: the script runs on stand-in tools
(nvidia-smi, cmake, cuobjdump, compute-sanitizer and a minamp_tests that writes GoogleTest's JSON
report), and the test checks the summary's verdicts — every stage passes when the tools do; a
skipped GPU test fails the test stage; a driver that refuses the compressed machine code at the first
launch has the build configured without compression and rebuilt, and the launch then passes, while any
other first-launch failure fails that stage alone; compute-sanitizer refusing the device is UNAVAILABLE,
not pass; memcheck runs with the allocator's exact-size mode; ONLY runs the check stages it
names and no other; a stage that hangs times out within the time limit and the stages after it are
skipped, not passed; the SASS stage reads each GEMM version's main loop (bench/gemm_sass.py on a
fake bench_gemm --kernels and cuobjdump) and fails on a spill — and that $OUT holds only the logs
and sass.json the header names. Standard library only; ctest runs it as bench.gpu_check.

The same file is the stand-in tools: `test_gpu_check.py --tool NAME ARGS...`; the environment
variables FAKE_SKIPPED_GPU_TEST, FAKE_TESTS_HANG, FAKE_SANITIZER_REFUSES, FAKE_SPILLS,
FAKE_REFUSES_COMPRESSED and FAKE_NO_DEVICE choose their failures; the stand-in cmake appends its
arguments to $FAKE_CMAKE_LOG."""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

from stand_ins import make_tool

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))


def fake_minamp_tests(args):
    """Writes the --gtest_output JSON: one GPU test, skipped when FAKE_SKIPPED_GPU_TEST is set,
    and a GpuAbsent test (which skips where there is a GPU); hangs when FAKE_TESTS_HANG is set."""
    if os.environ.get("FAKE_TESTS_HANG"):
        time.sleep(600)
    output = next((a for a in args if a.startswith("--gtest_output=json:")), None)
    if output:
        result = "SKIPPED" if os.environ.get("FAKE_SKIPPED_GPU_TEST") else "COMPLETED"
        report = {"testsuites": [
            {"name": "GpuGemm", "testsuite": [{"name": "SquareShapes", "result": result}]},
            {"name": "GpuAbsent", "testsuite": [{"name": "CudaTensorWithoutADeviceThrowsTheReason",
                                                 "result": "SKIPPED"}]}]}
        with open(output.split(":", 1)[1], "w") as f:
            json.dump(report, f)
    print("[  PASSED  ] 1 test.")


def fake_compute_sanitizer(args):
    if os.environ.get("FAKE_SANITIZER_REFUSES"):
        print("========= Error: Device not supported")
        sys.exit(1)
    if "memcheck" in args and os.environ.get("MINAMP_CUDA_EXACT_ALLOC") != "1":
        print("========= memcheck without MINAMP_CUDA_EXACT_ALLOC=1: the cache hides overruns")
        sys.exit(1)
    print("========= ERROR SUMMARY: 0 errors")


def fake_bench_gemm(args):
    """bench_gemm --kernels: one version, whose kernel the fake cuobjdump disassembles;
    --shapes tiny: the first launch, which fails as the real one would under FAKE_NO_DEVICE, and
    under FAKE_REFUSES_COMPRESSED until cmake has configured the build without compression."""
    if args == ["--kernels"]:
        print(json.dumps([{"version": "v1", "kernel": "fake_gemm_kernel", "threads": 128,
                           "smem_bytes": 8192}]))
        return
    assert args == ["--shapes", "tiny", "--precisions", "f16"], args
    if os.environ.get("FAKE_NO_DEVICE"):
        sys.exit("bench_gemm: cudaGetDeviceCount: CUDA error cudaErrorNoDevice (no CUDA-capable "
                 "device is detected)")
    if os.environ.get("FAKE_REFUSES_COMPRESSED") and \
            "-DMINAMP_CUDA_COMPRESS_FOR_SIZE=OFF" not in cmake_calls():
        sys.exit("bench_gemm: gemm_v1_kernel launch: CUDA error cudaErrorInvalidKernelImage "
                 "(device kernel image is invalid)")
    print("square 64 (64x64x64)  f16  0.00  0.00  33.3%")


def fake_cmake(args):
    with open(os.environ["FAKE_CMAKE_LOG"], "a") as f:
        f.write(" ".join(args) + "\n")


def cmake_calls():
    """The stand-in cmake's calls so far, one line each."""
    with open(os.environ["FAKE_CMAKE_LOG"]) as f:
        return f.read()


def fake_cuobjdump(args):
    """A kernel with a main loop of two HMMA (-sass), its registers (-res-usage); the fp32 object
    (--dump-sass) has no local memory. FAKE_SPILLS adds a spill to the GEMM kernel."""
    if "-res-usage" in args:
        print("Resource usage:")
        print(" Function fake_gemm_kernel:")
        print("  REG:96 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:600 TEXTURE:0 SURFACE:0 SAMPLER:0")
        return
    print("\t\tFunction : fake_gemm_kernel")
    print("        /*0000*/                   LDGSTS.E.BYPASS.128 [R2], desc[UR4][R4.64] ;")
    print("        /*0010*/                   HMMA.16816.F32 R0, R4, R8, R0 ;")
    print("        /*0020*/                   LDSM.16.M88.4 R8, [R3] ;")
    print("        /*0030*/                   HMMA.16816.F32 R0, R4, R8, R0 ;")
    print("        /*0040*/                   BRA 0x10 ;")
    if os.environ.get("FAKE_SPILLS"):
        print("        /*0050*/                   STL [R1], R0 ;")


TOOLS = {"minamp_tests": fake_minamp_tests, "compute-sanitizer": fake_compute_sanitizer,
         "cuobjdump": fake_cuobjdump, "nvidia-smi": lambda args: print("GPU 0: NVIDIA H100"),
         "cmake": fake_cmake, "bench_gemm": fake_bench_gemm}


class GpuCheckScript(unittest.TestCase):
    def run_script(self, time_limit_s=120, **failures):
        """Runs gpu-check.sh on the stand-ins (with `failures` added to its environment); returns
        (exit status, {stage: verdict}, $OUT's files)."""
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        bin_dir, build, out = (os.path.join(tmp.name, d) for d in ("bin", "build", "out"))
        self.out = out
        os.makedirs(bin_dir)
        os.makedirs(build)
        for name in ("nvidia-smi", "cmake", "cuobjdump", "compute-sanitizer"):
            make_tool(os.path.join(bin_dir, name), name, __file__)
        make_tool(os.path.join(build, "minamp_tests"), "minamp_tests", __file__)
        make_tool(os.path.join(build, "bench_gemm"), "bench_gemm", __file__)
        objects = os.path.join(build, "CMakeFiles", "minamp.dir", "cuda")
        os.makedirs(objects)
        for name in ("gemm_v1_fake.cu.o", "gemm_fp32.cu.o"):
            open(os.path.join(objects, name), "w").close()
        self.cmake_log = os.path.join(tmp.name, "cmake.log")
        open(self.cmake_log, "w").close()
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], BUILD=build,
                   OUT=out, TIME_LIMIT_S=str(time_limit_s), TMPDIR=tmp.name,
                   FAKE_CMAKE_LOG=self.cmake_log, **failures)
        process = subprocess.run(["bash", os.path.join(REPO, "scripts", "gpu-check.sh")],
                                 env=env, capture_output=True, text=True, timeout=110)
        summary = process.stdout[process.stdout.find("== summary"):] if "== summary" in \
            process.stdout else ""
        verdicts = dict(re.findall(r"^  (\S.*?)\s{2,}(\S.*?)(?:, \d+ s)?$", summary, re.MULTILINE))
        self.stdout = process.stdout
        return process.returncode, verdicts, sorted(os.listdir(out))

    def cmake_calls(self):
        with open(self.cmake_log) as f:
            return f.read().splitlines()

    def test_every_stage_passes_when_its_tools_do(self):
        status, verdicts, files = self.run_script()
        self.assertEqual(status, 0, verdicts)
        self.assertEqual(list(verdicts), ["device", "googletest build", "configure", "build",
                                          "first launch", "sass (GEMM objects)", "tests", "memcheck (Gpu*)",
                                          "racecheck (GEMM, reductions)"])
        self.assertEqual(set(verdicts.values()), {"pass"})
        self.assertNotIn("COMPRESS_FOR_SIZE", "\n".join(self.cmake_calls()))
        self.assertEqual(files, ["build.log", "memcheck.log", "racecheck.log", "sass.json",
                                 "setup.log", "tests.log"])
        with open(os.path.join(self.out, "sass.json")) as f:
            sass = json.load(f)
        # 96 registers x 128 threads: 5 blocks fit an SM's 65536 registers (8 KB of shared
        # memory would allow 25, 2048 threads 16).
        self.assertEqual({k: sass[0][k] for k in ("loop_hmma", "loop_ldsm", "loop_ldgsts",
                                                  "registers", "blocks_per_sm")},
                         {"loop_hmma": 2, "loop_ldsm": 1, "loop_ldgsts": 0, "registers": 96,
                          "blocks_per_sm": 5})

    def test_a_driver_that_refuses_compressed_code_gets_a_build_without_compression(self):
        status, verdicts, _ = self.run_script(FAKE_REFUSES_COMPRESSED="1")
        self.assertEqual(status, 0, self.stdout[-3000:])
        self.assertEqual(verdicts["first launch"], "pass")
        self.assertIn("the driver refused the kernel image; rebuilding with "
                      "-DMINAMP_CUDA_COMPRESS_FOR_SIZE=OFF", self.stdout)
        calls = self.cmake_calls()
        reconfigure = next(i for i, call in enumerate(calls)
                           if "-DMINAMP_CUDA_COMPRESS_FOR_SIZE=OFF" in call)
        self.assertGreater(reconfigure, 0, "the first configure already turned compression off")
        self.assertTrue(calls[reconfigure].startswith("-S . -B "), calls)
        # then one rebuild of the same folder, and nothing else
        self.assertEqual(calls[reconfigure + 1:], [calls[reconfigure - 1]], calls)
        self.assertRegex(calls[reconfigure - 1], r"^--build \S+ -j16$")

    def test_any_other_first_launch_failure_fails_that_stage_without_a_rebuild(self):
        status, verdicts, _ = self.run_script(FAKE_NO_DEVICE="1")
        self.assertNotEqual(status, 0)
        self.assertEqual(verdicts["first launch"], "FAIL (exit 1)")
        self.assertIn("cudaErrorNoDevice", self.stdout)
        self.assertNotIn("COMPRESS_FOR_SIZE", "\n".join(self.cmake_calls()))
        self.assertEqual(verdicts["tests"], "pass")

    def test_a_gemm_kernel_that_spills_fails_the_sass_stage(self):
        status, verdicts, _ = self.run_script(FAKE_SPILLS="1")
        self.assertNotEqual(status, 0)
        self.assertEqual(verdicts["sass (GEMM objects)"], "FAIL (exit 1)")
        self.assertEqual(verdicts["tests"], "pass")

    def test_a_skipped_gpu_test_fails_the_test_stage(self):
        status, verdicts, _ = self.run_script(FAKE_SKIPPED_GPU_TEST="1")
        self.assertNotEqual(status, 0)
        self.assertEqual(verdicts["tests"], "FAIL (exit 1)")
        self.assertEqual(verdicts["memcheck (Gpu*)"], "pass")

    def test_a_stage_that_hangs_times_out_within_the_limit_and_skips_the_rest(self):
        start = time.monotonic()
        status, verdicts, _ = self.run_script(time_limit_s=25, FAKE_TESTS_HANG="1")
        self.assertLess(time.monotonic() - start, 25, "the time limit was overrun")
        self.assertNotEqual(status, 0)
        self.assertRegex(verdicts["tests"], r"^TIMEOUT after 1[0-5] s$")
        self.assertEqual(verdicts["memcheck (Gpu*)"], "SKIPPED (time limit reached)")
        self.assertEqual(verdicts["racecheck (GEMM, reductions)"], "SKIPPED (time limit reached)")
        self.assertEqual(verdicts["build"], "pass")

    def test_a_sanitizer_that_refuses_the_device_is_unavailable_not_passed(self):
        status, verdicts, _ = self.run_script(FAKE_SANITIZER_REFUSES="1")
        self.assertNotEqual(status, 0)
        unavailable = "UNAVAILABLE (compute-sanitizer: Device not supported; unverified)"
        self.assertEqual(verdicts["memcheck (Gpu*)"], unavailable)
        self.assertEqual(verdicts["racecheck (GEMM, reductions)"], unavailable)
        self.assertEqual(verdicts["tests"], "pass")

    def test_only_runs_the_check_stages_it_names(self):
        status, verdicts, files = self.run_script(ONLY="racecheck")
        self.assertEqual(status, 0, verdicts)
        not_run = "not run (ONLY=racecheck)"
        self.assertEqual(verdicts, {"device": "pass", "googletest build": "pass",
                                    "configure": "pass", "build": "pass", "first launch": "pass",
                                    "sass (GEMM objects)": not_run, "tests": not_run,
                                    "memcheck (Gpu*)": not_run,
                                    "racecheck (GEMM, reductions)": "pass"})
        self.assertEqual(files, ["build.log", "racecheck.log", "setup.log"])

    def test_only_refuses_a_stage_it_does_not_know(self):
        status, verdicts, files = self.run_script(ONLY="memcheck typo")
        self.assertEqual(status, 2)
        self.assertEqual((verdicts, files), ({}, []), "a stage ran")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--tool"]:
        TOOLS[sys.argv[2]](sys.argv[3:])
    else:
        unittest.main()
