"""Test of bench/profile-gpu.sh and bench/ncu_table.py without a GPU: the script runs on stand-in
tools (nvidia-smi, and an ncu that checks the options the script depends on and writes Nsight
Compute's CSV — its details page, one row per launch and metric, after ncu's own ==PROF==
lines — for the kernels a sine training run or bench_gemm would launch), and the test checks the
tables:
the step table holds exactly the second training step's kernels, between two optimizer launches;
the unfused profile runs with MINAMP_FUSION=0; the GEMM table has the loop's metrics under their
labels; a metric ncu refuses is dropped and the profile run again without it; a hanging ncu is cut
to the run's time limit; $OUT holds the log, the tables and the CSV archive. The formatter's own
parts (kernel names, units, the step) are tested on their own. Standard library only; ctest runs
it as bench.profile_gpu.

The same file is the stand-in tools: `test_profile_gpu.py --tool NAME ARGS...`; FAKE_NCU_REFUSES
(a metric) and FAKE_NCU_HANGS choose the stand-in ncu's failures."""

import csv
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest

from stand_ins import make_tool, option

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench"))
import ncu_table  # noqa: E402

GEMM = ("void (anonymous namespace)::gemm_v5_kernel<(anonymous namespace)::MmaConfig<128, 256, 64, "
        "2, 4, 3>, (anonymous namespace)::OperandTraits<__half, 4>, __half>"
        "((anonymous namespace)::GemmParams<__half>)")
ADAM = "void (anonymous namespace)::adam_kernel((anonymous namespace)::AdamChunks, const float *)"


def step_kernels(fused):
    """The kernels of one made-up sine step, ending with the optimizer's launch: (name, µs)."""
    forward = ("void (anonymous namespace)::gemm_thin_k_fixed_columns_kernel<0, 1, 2, __half>"
               "(ThinKParams)" if fused else "void column_partials_kernel<1>(ColumnParams)")
    return [("void (anonymous namespace)::zero_kernel(float *, long)", 2.0), (forward, 85.25),
            (GEMM, 320.5), (ADAM, 14.5)]


def fake_ncu(args):
    """Nsight Compute's CSV (--csv --log-file) for bench_train's three sine steps or for
    bench_gemm's v5 kernels, with the metrics asked for; refuses what the script must not pass."""
    if args == ["--version"]:
        print("NVIDIA (R) Nsight Compute Command Line Profiler\nVersion 2025.3.0.0 (build 1)")
        return
    if os.environ.get("FAKE_NCU_HANGS"):
        time.sleep(600)
    assert "--" not in args, args
    assert option(args, "--clock-control") == "none" and option(args, "--cache-control") == "none"
    metrics = option(args, "--metrics").split(",")
    refused = os.environ.get("FAKE_NCU_REFUSES")
    log = option(args, "--log-file")
    if refused in metrics:
        with open(log, "w") as f:
            f.write(f"==ERROR== Failed to find metric {refused}\n")
        sys.exit(1)
    program = next(a for a in args if os.path.isabs(a) and os.access(a, os.X_OK))
    program_args = args[args.index(program) + 1:]
    if program.endswith("bench_train"):
        assert option(program_args, "--models") == "sine" and "--steps" in program_args
        assert option(program_args, "--warmup") == "1", "the table needs one step before"
        fused = os.environ.get("MINAMP_FUSION") != "0"
        launches = (step_kernels(fused) * 3)[:-1] + [("void map_kernel<float>(float *)", 2.5)]
    else:
        assert option(args, "-k") == "regex:gemm_v5" and option(args, "--launch-count") == "1"
        assert "--no-versions" in program_args and option(program_args, "--shapes") == "square"
        launches = [(GEMM, 340.0), (GEMM, 2630.0)]
    out = io.StringIO()
    out.write("==PROF== Connected to process 1234 (fake)\n")
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow(["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context",
                     "Stream", "Block Size", "Grid Size", "Device", "CC", "Section Name",
                     "Metric Name", "Metric Unit", "Metric Value"])
    for i, (kernel, us) in enumerate(launches):
        for metric in metrics:
            unit, value = {"gpu__time_duration.sum": ("usecond", f"{us:.2f}"),
                           "launch__grid_size": ("", "2,048"), "launch__block_size": ("", "256"),
                           "launch__registers_per_thread": ("register/thread", "64")}.get(
                               metric, ("", "3.25"))
            if metric == "gpu__time_duration.sum" and us > 1000:
                unit, value = "msecond", f"{us / 1000:.2f}"
            writer.writerow([i, 1234, "fake", "localhost", kernel, 1, 7, "(256, 1, 1)",
                             "(2048, 1, 1)", 0, 9.0, "Command line profiler metrics", metric,
                             unit, value])
    out.write("==PROF== Disconnected from process 1234\n")
    with open(log, "w") as f:
        f.write(out.getvalue())


TOOLS = {"ncu": fake_ncu, "nvidia-smi": lambda args: print("NVIDIA H200, 580.159.04, 1980 MHz"),
         "bench_train": lambda args: None, "bench_gemm": lambda args: None}


class ProfileScript(unittest.TestCase):
    def run_script(self, time_limit_s=120, **environment):
        """Runs profile-gpu.sh on the stand-ins; returns (exit status, output, the tables' text,
        $OUT's files)."""
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        bin_dir, build, out, results = (os.path.join(tmp.name, d)
                                        for d in ("bin", "build", "out", "results"))
        self.out = out
        os.makedirs(bin_dir)
        os.makedirs(build)
        for name in ("ncu", "nvidia-smi"):
            make_tool(os.path.join(bin_dir, name), name, __file__)
        for name in ("bench_train", "bench_gemm"):
            make_tool(os.path.join(build, name), name, __file__)
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], BUILD=build,
                   OUT=out, RESULTS=results, COMMIT="abc1234", TIME_LIMIT_S=str(time_limit_s),
                   TMPDIR=tmp.name,                   **environment)
        process = subprocess.run(["bash", os.path.join(REPO, "bench", "profile-gpu.sh")], env=env,
                                 capture_output=True, text=True, timeout=110)
        tables = ""
        if os.path.isdir(results):
            for name in os.listdir(results):
                with open(os.path.join(results, name)) as f:
                    tables = f.read()
        files = sorted(os.listdir(out)) if os.path.isdir(out) else []
        return process.returncode, process.stdout + process.stderr, tables, files

    def section(self, tables, title):
        start = tables.index("## " + title)
        end = tables.find("\n## ", start + 1)
        return tables[start:] if end < 0 else tables[start:end]

    def test_the_tables_hold_one_step_and_the_gemm_loop(self):
        status, output, tables, files = self.run_script()
        self.assertEqual(status, 0, output)
        self.assertEqual([f.split("-abc1234")[1] for f in files], ["-csv.tgz", ".log", ".md"])
        self.assertTrue(files[0].startswith("ncu-h200-"), files)
        fused = self.section(tables, "sine AMP step (512x512), fused (default)")
        # The second step: from the launch after the first adam_kernel to the second.
        self.assertIn("4 kernels, 422.2 µs", fused)
        self.assertIn("| 85.2 | 2,048 | 256 | 64 | gemm_thin_k_fixed_columns_kernel | 0, 1, 2, "
                      "__half |", fused)
        self.assertNotIn("map_kernel", fused)
        self.assertIn("| gemm_v5_kernel | 1 | 320.5 | 75.9% |", fused)
        unfused = self.section(tables, "sine AMP step (512x512), MINAMP_FUSION=0")
        self.assertIn("column_partials_kernel", unfused)
        self.assertNotIn("gemm_thin_k", unfused)
        loop = self.section(tables, "v5 GEMM over the square shapes")
        self.assertIn("| µs | grid | block | regs | warps / SM | tensor pipe % | issued / cycle | "
                      "cycles / issue | stall wait |", loop)
        self.assertIn("stall dispatch_stall | kernel |", loop)
        self.assertIn("| 2630.0 | 2,048 |", loop, "a time in ms is given in µs")
        with tarfile.open(os.path.join(self.out, files[0])) as archive:
            names = sorted(os.path.basename(n) for n in archive.getnames() if n.endswith(".csv"))
        self.assertEqual(names, ["gemm-loop.csv", "sine-step-unfused.csv", "sine-step.csv"])

    def test_a_metric_ncu_refuses_is_dropped(self):
        refused = "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio"
        status, output, tables, _ = self.run_script(FAKE_NCU_REFUSES=refused)
        self.assertEqual(status, 0, output)
        self.assertIn(f"ncu does not know {refused}: profiling again without", output)
        loop = self.section(tables, "v5 GEMM over the square shapes")
        self.assertIn("stall not_selected | kernel |", loop)
        self.assertNotIn("dispatch_stall", loop)

    def test_a_hanging_ncu_is_cut_to_the_time_limit(self):
        start = time.monotonic()
        status, output, tables, files = self.run_script(time_limit_s=20, FAKE_NCU_HANGS="1")
        self.assertLess(time.monotonic() - start, 20 + 15, "the time limit was overrun")
        self.assertNotEqual(status, 0)
        self.assertIn("-- sine-step: exit 124", output)
        self.assertIn("== gemm-loop: skipped, the run's time limit is spent", output)
        self.assertEqual(tables, "", "a run without tables wrote a report")

    def test_profiles_refuses_a_name_it_does_not_know(self):
        status, output, tables, files = self.run_script(PROFILES="sine-step typo")
        self.assertEqual(status, 2)
        self.assertIn("PROFILES names 'typo'", output)
        self.assertEqual((tables, files), ("", []))

    def test_profiles_runs_the_ones_it_names(self):
        status, output, tables, _ = self.run_script(PROFILES="gemm-loop")
        self.assertEqual(status, 0, output)
        self.assertEqual(tables.count("\n## "), 1)
        self.assertIn("## v5 GEMM", tables)


class NcuTable(unittest.TestCase):
    def test_kernel_names_lose_namespaces_and_parameters(self):
        self.assertEqual(ncu_table.short_kernel(GEMM),
                         ("gemm_v5_kernel", "MmaConfig<128, 256, 64, 2, 4, 3>, "
                                            "OperandTraits<__half, 4>, __half"))
        self.assertEqual(ncu_table.short_kernel(ADAM), ("adam_kernel", ""))
        self.assertEqual(ncu_table.short_kernel("void minamp::sum_kernel<(int)1>(float *)"),
                         ("sum_kernel", "(int)1"))
        function, arguments = ncu_table.short_kernel("k<" + "a" * 200 + ">(int)", width=20)
        self.assertEqual((function, len(arguments)), ("k", 20))

    def test_stalls_and_known_metrics_have_short_labels(self):
        self.assertEqual(ncu_table.label(
            "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio"),
            "stall short_scoreboard")
        self.assertEqual(ncu_table.label("dram__bytes.sum"), "dram__bytes.sum")

    def write(self, text):
        tmp = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
        self.addCleanup(os.unlink, tmp.name)
        tmp.write(text)
        tmp.close()
        return tmp.name

    def test_times_are_read_in_their_unit(self):
        header = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
        rows = ''.join(f'"{i}","k{i}","gpu__time_duration.sum","{unit}","{value}"\n'
                       for i, (unit, value) in enumerate([("nsecond", "1,500"), ("usecond", "2"),
                                                          ("msecond", "0.5")]))
        launches, order = ncu_table.read_launches(self.write("==PROF== x\n" + header + rows))
        self.assertEqual(order, ["gpu__time_duration.sum"])
        self.assertEqual([l["metrics"]["gpu__time_duration.sum"] for l in launches],
                         [1.5, 2.0, 500.0])

    def test_a_step_needs_two_optimizer_launches(self):
        launches = [{"kernel": name} for name in ("a", ADAM, "b", "c", ADAM, "d")]
        self.assertEqual([l["kernel"] for l in ncu_table.one_step(launches, "adam_kernel")],
                         ["b", "c", ADAM])
        self.assertIsNone(ncu_table.one_step(launches[:3], "adam_kernel"))
        path = self.write('"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
                          f'"0","{ADAM}","gpu__time_duration.sum","usecond","3"\n')
        process = subprocess.run([sys.executable, os.path.join(REPO, "bench", "ncu_table.py"),
                                  "--step", "adam_kernel", path], capture_output=True, text=True)
        self.assertEqual(process.returncode, 1)
        self.assertIn("matches fewer than two of the 1 launches", process.stderr)

    def test_a_file_without_launches_is_an_error(self):
        process = subprocess.run([sys.executable, os.path.join(REPO, "bench", "ncu_table.py"),
                                  self.write("==ERROR== the application failed\n")],
                                 capture_output=True, text=True)
        self.assertEqual(process.returncode, 1)
        self.assertIn("holds no kernel launch", process.stderr)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--tool"]:
        TOOLS[sys.argv[2]](sys.argv[3:])
    else:
        unittest.main()
