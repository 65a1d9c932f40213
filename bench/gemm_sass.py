#!/usr/bin/env python3
"""Reads the machine code of each tensor-core GEMM version without a GPU.

For every version bench_gemm --kernels lists (the kernel it runs for a 4096^3 GEMM of plain f16
matrices into f16 C, with its threads and dynamic shared memory per block), this finds that kernel
in the version's object file (cuda/gemm_v<N>_*.cu.o of a build), disassembles it for one
architecture with cuobjdump -sass, and reports for its main loop (the loop with the most HMMA
instructions): the HMMA count, the other instructions per HMMA, the shared-memory loads (LDSM,
LDS), the cp.async copies (LDGSTS) and the global loads (LDG), and the fixed stalls: the cycles
ptxas makes the warp wait after each instruction before it issues the next (the stall count of
each instruction's control bits, bits 41-44 of its second 64-bit word), added up over the loop
and per HMMA, the least a warp can take per HMMA before any variable-latency wait (memory,
barrier) or another warp's turn; and for the kernel: registers per
thread (cuobjdump -res-usage), local memory (spills), and the blocks per SM that registers,
shared memory and threads allow on an sm_90 SM (65536 registers, 228 KB of shared memory with
1 KB reserved per block, 2048 threads, 32 blocks). These are the static figures a GPU run checks.

    python3 bench/gemm_sass.py (--kernels kernels.json | --bench-gemm BUILD/bench_gemm)
        --objects BUILD/CMakeFiles/minamp.dir/cuda [--arch sm_90] [--json out.json]
        [--skip-without-cuobjdump]

kernels.json is what `bench_gemm --kernels` prints (--bench-gemm runs it). cuobjdump comes from
the CUDA toolkit or PyPI's nvidia-cuda-cuobjdump (its nvidia/cu13/bin is searched too); c++filt
from binutils. Exits 1 when a version's kernel is missing or touches local memory (a spill);
with --skip-without-cuobjdump, 77 (a skipped test, for ctest) where there is no cuobjdump.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys

# An sm_90 SM: what occupancy is worked out from.
SM_REGISTERS = 65536
SM_SHARED_BYTES = 228 * 1024
SHARED_RESERVED_PER_BLOCK = 1024
SM_THREADS = 2048
SM_BLOCKS = 32
REGISTER_GRANULE = 8  # registers are allocated per thread in multiples of 8 (per warp: of 256)


SKIPPED = 77  # ctest's SKIP_RETURN_CODE for this test


def find_tool(name):
    """The tool's path, or None."""
    found = shutil.which(name)
    if found:
        return found
    try:
        import nvidia  # PyPI's nvidia-cuda-cuobjdump installs under the nvidia namespace
        for root in nvidia.__path__:
            for candidate in glob.glob(os.path.join(root, "*", "bin", name)):
                return candidate
    except ImportError:
        pass
    return None


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return dict(zip(names, out))


def functions(cuobjdump, obj, arch):
    """{mangled name: [SASS lines]} of every kernel in the object, for `arch`."""
    text = subprocess.run([cuobjdump, "-sass", "-arch", arch, obj], capture_output=True,
                          text=True, check=True).stdout
    result, current = {}, None
    for line in text.splitlines():
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            current = m.group(1)
            result[current] = []
        elif current:
            result[current].append(line)
    return result


def registers(cuobjdump, obj, arch):
    """{mangled name: (registers, local bytes)} from cuobjdump -res-usage."""
    text = subprocess.run([cuobjdump, "-res-usage", "-arch", arch, obj], capture_output=True,
                          text=True, check=True).stdout
    result, name = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"REG:(\d+).*LOCAL:(\d+)", line)
        if name and m:
            result[name] = (int(m.group(1)), int(m.group(2)))
    return result


INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*?);")
# A 128-bit instruction is printed as two 64-bit words, the second on the line after it; the stall
# count is 4 bits of that second word (the control bits of Volta and later).
ENCODING_WORD = re.compile(r"^\s*/\*\s*0x([0-9a-f]{16})\s*\*/\s*$")  # a line of its own
STALL_SHIFT, STALL_MASK = 41, 0xF


def instructions(lines):
    """[(address, opcode, operands, stall cycles)] of a function's SASS (stall None where the
    second word of the encoding is missing)."""
    out = []
    for i, line in enumerate(lines):
        m = INSTRUCTION.search(line)
        if not m:
            continue
        word = ENCODING_WORD.search(lines[i + 1]) if i + 1 < len(lines) else None
        stall = (int(word.group(1), 16) >> STALL_SHIFT) & STALL_MASK if word else None
        out.append((int(m.group(1), 16), m.group(3), m.group(4), stall))
    return out


def main_loop(code):
    """The body of the loop (a backward branch) with the most HMMA, the shortest of those: a
    kernel with an interior main loop and an edge one reports the interior one."""
    best, best_key = [], (0, 0)
    for i, (address, opcode, operands, _) in enumerate(code):
        if not opcode.startswith("BRA"):
            continue
        m = re.search(r"0x([0-9a-f]+)", operands)
        if not m or int(m.group(1), 16) >= address:
            continue
        target = int(m.group(1), 16)
        body = [c for c in code[: i + 1] if c[0] >= target]
        key = (count(body, "HMMA"), -len(body))
        if key > best_key:
            best, best_key = body, key
    return best


def count(body, prefix):
    return sum(opcode.split(".")[0] == prefix for _, opcode, _, _ in body)


def stall_cycles(body):
    """The fixed stalls of the instructions of body, added up (None if one is unknown)."""
    stalls = [stall for _, _, _, stall in body]
    return None if None in stalls else sum(stalls)


def blocks_per_sm(regs, threads, smem):
    per_thread = -(-regs // REGISTER_GRANULE) * REGISTER_GRANULE
    by_registers = SM_REGISTERS // (per_thread * threads) if regs else SM_BLOCKS
    by_shared = SM_SHARED_BYTES // (smem + SHARED_RESERVED_PER_BLOCK)
    return min(by_registers, by_shared, SM_THREADS // threads, SM_BLOCKS)


def analyse(info, objects, arch, cuobjdump):
    version = info["version"]
    paths = glob.glob(os.path.join(objects, f"gemm_{version}_*.cu.o"))
    if not paths:
        return {"version": version, "error": f"no gemm_{version}_*.cu.o under {objects}"}
    # A version may be instantiated over several objects (v5: four): the kernel is in one.
    found = []
    for obj in sorted(paths):
        sass = functions(cuobjdump, obj, arch)
        names = demangle(list(sass))
        found += [(obj, sass, m) for m, d in names.items() if info["kernel"] in d]
    if len(found) != 1:
        return {"version": version, "error": f"{len(found)} kernels match {info['kernel']}"}
    obj, sass, mangled = found[0]
    code = instructions(sass[mangled])
    loop = main_loop(code)
    hmma = count(loop, "HMMA")
    stalls = stall_cycles(loop)
    regs, local = registers(cuobjdump, obj, arch).get(mangled, (0, 0))
    return {
        "version": version, "kernel": info["kernel"], "object": os.path.basename(obj),
        "arch": arch, "instructions": len(code), "loop_instructions": len(loop),
        "loop_hmma": hmma,
        "loop_other_per_hmma": (len(loop) - hmma) / hmma if hmma else None,
        "loop_ldsm": count(loop, "LDSM"), "loop_lds": count(loop, "LDS"),
        "loop_ldgsts": count(loop, "LDGSTS"), "loop_ldg": count(loop, "LDG"),
        "loop_bar": count(loop, "BAR"),
        "loop_stall_cycles": stalls,
        "loop_stall_cycles_per_hmma": stalls / hmma if hmma and stalls is not None else None,
        "kernel_local_memory": count(code, "LDL") + count(code, "STL"),
        "registers": regs, "local_bytes": local, "threads": info["threads"],
        "smem_bytes": info["smem_bytes"],
        "blocks_per_sm": blocks_per_sm(regs, info["threads"], info["smem_bytes"]),
    }


def print_table(rows):
    head = ("version", "regs", "smem KB", "blocks/SM", "warps/SM", "loop HMMA", "other/HMMA",
            "LDSM", "LDS", "LDGSTS", "LDG", "stalls", "stall/HMMA", "LDL/STL")
    print("  ".join(f"{h:>10}" for h in head))
    for r in rows:
        if "error" in r:
            print(f"{r['version']:>10}  {r['error']}")
            continue
        other, stall = r["loop_other_per_hmma"], r["loop_stall_cycles_per_hmma"]
        cells = (r["version"], r["registers"], f"{r['smem_bytes'] / 1024:.1f}", r["blocks_per_sm"],
                 r["blocks_per_sm"] * r["threads"] // 32, r["loop_hmma"],
                 "n/a" if other is None else f"{other:.2f}", r["loop_ldsm"], r["loop_lds"],
                 r["loop_ldgsts"], r["loop_ldg"],
                 "n/a" if r["loop_stall_cycles"] is None else r["loop_stall_cycles"],
                 "n/a" if stall is None else f"{stall:.2f}", r["kernel_local_memory"])
        print("  ".join(f"{c:>10}" for c in cells))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--kernels", help="the JSON bench_gemm --kernels prints")
    source.add_argument("--bench-gemm", help="a bench_gemm binary to run with --kernels")
    p.add_argument("--objects", required=True, help="folder of the gemm_v*.cu.o objects")
    p.add_argument("--arch", default="sm_90", help="the architecture to disassemble (sm_90)")
    p.add_argument("--json", help="also write the figures to this JSON file")
    p.add_argument("--skip-without-cuobjdump", action="store_true",
                   help=f"exit {SKIPPED} (skipped) rather than 1 where cuobjdump is not found")
    args = p.parse_args()
    cuobjdump = find_tool("cuobjdump")
    if not cuobjdump:
        print("gemm_sass: cuobjdump not found (CUDA toolkit, or pip install "
              "nvidia-cuda-cuobjdump)", file=sys.stderr)
        return SKIPPED if args.skip_without_cuobjdump else 1
    try:
        if args.bench_gemm:
            kernels = json.loads(subprocess.run([args.bench_gemm, "--kernels"], check=True,
                                                capture_output=True, text=True).stdout)
        else:
            with open(args.kernels) as f:
                kernels = json.load(f)
    except (OSError, ValueError, subprocess.CalledProcessError) as e:
        sys.exit(f"gemm_sass: the kernel list: {e}")
    rows = [analyse(info, args.objects, args.arch, cuobjdump) for info in kernels]
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
            f.write("\n")
    return 1 if any("error" in r or r["kernel_local_memory"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
