"""Test of bench/gemm_sass.py without a CUDA toolkit: the script runs on a stand-in cuobjdump that
prints a made-up kernel's SASS (a prologue, an edge loop and an interior loop, each instruction's
second encoding word on the line after it, as cuobjdump prints them) and its resource usage, and
the test checks the figures it reports: the main loop is the one with the most HMMA; its HMMA,
other instructions, shared loads and copies are counted; its fixed stalls are the stall counts of
the instructions' control bits added up, and per HMMA; blocks per SM follow from registers,
shared memory and threads; an instruction whose second word is missing leaves the stalls
unknown, not zero; a kernel that touches local memory fails the run. Standard library only;
ctest runs it as bench.gemm_sass.

The same file is the stand-in cuobjdump: `test_gemm_sass.py --tool cuobjdump ARGS...`;
FAKE_SASS_SPILLS adds a local-memory store, FAKE_SASS_TRUNCATED drops a second word."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

from stand_ins import make_tool

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
SCRIPT = os.path.join(REPO, "bench", "gemm_sass.py")
sys.path.insert(0, os.path.join(REPO, "bench"))
import gemm_sass  # noqa: E402

MANGLED = "_Z14gemm_v5_kernelILi128EEvPKfPf"  # c++filt: void gemm_v5_kernel<128>(float const*, float*)
STALL_SHIFT = 41


def instruction(address, text, stall):
    """cuobjdump -sass's two lines of one instruction with the given stall count."""
    first = f"        /*{address:04x}*/                   {text} ;"
    second = f"{0x000fe20000000000 & ~(0xF << STALL_SHIFT) | stall << STALL_SHIFT:016x}"
    return [f"{first:<90}/* 0x0000000000007a02 */", f"{'':<90}/* 0x{second} */"]


# The made-up kernel: (opcode and operands, stall). The edge loop at 0x0040 has 1 HMMA; the
# interior loop at 0x0080 has 2 HMMA among 6 instructions, its stalls 6 + 1 + 5 + 2 + 1 + 1 = 16.
PROLOGUE = [("MOV R1, c[0x0][0x28]", 1), ("S2R R0, SR_TID.X", 2), ("LDGSTS.E.128 [R2], [R4.64]", 1),
            ("BAR.SYNC.DEFER_BLOCKING 0x0", 1)]
EDGE_LOOP = [("LDS.128 R8, [R2]", 1), ("HMMA.16816.F32 R12, R8, R10, R12", 6),
             ("ISETP.NE.AND P0, PT, R3, RZ, PT", 1), ("@P0 BRA 0x40", 5)]
INTERIOR_LOOP = [("HMMA.16816.F32 R12, R8, R10, R12", 6), ("LDSM.16.M88.4 R8, [R2]", 1),
                 ("HMMA.16816.F32 R16, R8, R10, R16", 5), ("LDGSTS.E.128 [R2], [R4.64]", 2),
                 ("IADD3 R3, R3, -0x1, RZ", 1), ("@P0 BRA 0x80", 1)]
EPILOGUE = [("STG.E.128 [R6.64], R12", 1), ("EXIT", 5)]


def sass_lines():
    body = PROLOGUE + EDGE_LOOP + INTERIOR_LOOP + EPILOGUE
    if os.environ.get("FAKE_SASS_SPILLS"):
        body = body[:-1] + [("STL [R1], R12", 1)] + body[-1:]
    lines = []
    for i, (text, stall) in enumerate(body):
        lines += instruction(0x10 * i, text, stall)
    if os.environ.get("FAKE_SASS_TRUNCATED"):
        del lines[2 * (len(PROLOGUE) + len(EDGE_LOOP)) + 1]  # the interior loop's first second word
    return lines


def fake_cuobjdump(args):
    """cuobjdump -sass / -res-usage -arch sm_90 OBJECT for the one kernel above."""
    assert args[:1] in (["-sass"], ["-res-usage"]) and args[1:3] == ["-arch", "sm_90"], args
    if args[0] == "-sass":
        print(f"\n\tcode for sm_90\n\t\tFunction : {MANGLED}\n\t.headerflags\t@\"EF_CUDA_SM90\"")
        print("\n".join(sass_lines()))
    else:
        local = 16 if os.environ.get("FAKE_SASS_SPILLS") else 0
        print(f" Function {MANGLED}:\n  REG:218 STACK:0 SHARED:0 LOCAL:{local} CONSTANT[0]:568")


TOOLS = {"cuobjdump": fake_cuobjdump}


class GemmSassTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        tools = os.path.join(self.tmp.name, "bin")
        os.makedirs(tools)
        make_tool(os.path.join(tools, "cuobjdump"), "cuobjdump", __file__)
        self.objects = os.path.join(self.tmp.name, "objects")
        os.makedirs(self.objects)
        open(os.path.join(self.objects, "gemm_v5_multistage.cu.o"), "w").close()
        self.kernels = os.path.join(self.tmp.name, "kernels.json")
        with open(self.kernels, "w") as f:
            json.dump([{"version": "v5", "kernel": "gemm_v5_kernel<128>", "threads": 256,
                        "smem_bytes": 156672}], f)
        self.env = dict(os.environ, PATH=tools + os.pathsep + os.environ["PATH"])

    def run_script(self, **env):
        out = os.path.join(self.tmp.name, "sass.json")
        result = subprocess.run(
            [sys.executable, SCRIPT, "--kernels", self.kernels, "--objects", self.objects,
             "--json", out], env=dict(self.env, **env), capture_output=True, text=True,
            timeout=60)
        with open(out) as f:
            return result, json.load(f)[0]

    def test_reads_the_interior_loop(self):
        result, row = self.run_script()
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(row["loop_instructions"], len(INTERIOR_LOOP))
        self.assertEqual(row["loop_hmma"], 2)
        self.assertEqual(row["loop_other_per_hmma"], 2.0)
        self.assertEqual((row["loop_ldsm"], row["loop_lds"], row["loop_ldgsts"]), (1, 0, 1))
        self.assertEqual(row["loop_stall_cycles"], sum(stall for _, stall in INTERIOR_LOOP))
        self.assertEqual(row["loop_stall_cycles_per_hmma"], 8.0)
        self.assertEqual(row["instructions"],
                         len(PROLOGUE) + len(EDGE_LOOP) + len(INTERIOR_LOOP) + len(EPILOGUE))
        # 218 registers -> 224 a thread: 65536 / (224 * 256) = 1 block; 153 KB + 1 KB: 1 block.
        self.assertEqual((row["registers"], row["blocks_per_sm"]), (218, 1))
        self.assertEqual(row["kernel_local_memory"], 0)
        self.assertIn("stall/HMMA", result.stdout)
        self.assertRegex(result.stdout, r"\b8\.00\b")

    def test_a_missing_second_word_leaves_the_stalls_unknown(self):
        result, row = self.run_script(FAKE_SASS_TRUNCATED="1")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(row["loop_hmma"], 2)
        self.assertIsNone(row["loop_stall_cycles"])
        self.assertIsNone(row["loop_stall_cycles_per_hmma"])

    def test_local_memory_fails_the_run(self):
        result, row = self.run_script(FAKE_SASS_SPILLS="1")
        self.assertEqual(result.returncode, 1)
        self.assertEqual(row["kernel_local_memory"], 1)
        self.assertEqual(row["local_bytes"], 16)

    def test_stall_bits_of_a_real_encoding(self):
        # An HMMA of v5's sm_90 main loop (nvcc 13), as cuobjdump prints it: stall count 5.
        lines = ["        /*9b60*/                   HMMA.16816.F32 R4, R132.reuse, R136, R4 ;"
                 "                              /* 0x000000888404723c */",
                 " " * 106 + "/* 0x050fea0000001804 */"]
        self.assertEqual(gemm_sass.instructions(lines),
                         [(0x9B60, "HMMA.16816.F32", " R4, R132.reuse, R136, R4 ", 5)])

if __name__ == "__main__":
    if sys.argv[1:2] == ["--tool"]:
        TOOLS[sys.argv[2]](sys.argv[3:])
    else:
        unittest.main()
