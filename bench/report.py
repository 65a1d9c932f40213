"""Merges one benchmark run — bench_train's JSON, the PyTorch peer's JSON and (on a GPU)
bench_gemm's JSON — with where and when it ran (device, driver, commit, date), writes the
combined JSON, prints the comparison table with the issue's targets and ratios, and writes the
same table as Markdown for the README. Standard library only: it runs beside any Python."""

import argparse
import datetime
import json
import os
import platform
import subprocess


def command_output(*argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def where_and_when(platform_name, commit):
    commit = commit or command_output("git", "rev-parse", "--short", "HEAD") or "unknown"
    if command_output("git", "status", "--porcelain", "--untracked-files=no"):
        commit += "-dirty"
    meta = {"platform": platform_name,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit, "host_cpu": cpu_model(), "host_cores": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1_5_15_min": [round(x, 2) for x in os.getloadavg()]}
    if platform_name == "gpu":
        gpu = command_output("nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                             "--format=csv,noheader")
        meta["gpu"] = gpu.splitlines()[0] if gpu else "unknown"
        meta["nvcc"] = (command_output("nvcc", "--version") or "unknown").splitlines()[-1]
    return meta


def load_one(path):
    """The JSON at path, or None when there is none (the tool did not run or failed)."""
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def load(paths):
    """One result from several files of the same tool: their runs and models merged, every
    other field from the first. None when no file exists."""
    results = [r for r in (load_one(p) for p in paths or []) if r is not None]
    if not results:
        return None
    merged = dict(results[0], runs=[], models={})
    for r in results:
        merged["runs"] += r.get("runs", [])
        merged["models"].update(r.get("models", {}))
    return merged


def find(result, model, precision, mode):
    if not result:
        return None
    for run in result["runs"]:
        if (run["model"], run["precision"], run["mode"]) == (model, precision, mode) \
                and "error" not in run:
            return run
    return None


def median(run):
    return run["step_ms"]["median"] if run else None


def ratio(a, b):
    return a / b if a is not None and b else None


def step_target(name, ours, theirs, bound, minamp, pytorch):
    """A row comparing minamp's median step time with PyTorch's."""
    a, b = find(minamp, *ours), find(pytorch, *theirs)
    return {"target": name, "minamp": median(a), "reference": median(b), "unit": "ms",
            "bound": bound, "ratio": ratio(median(a), median(b)), "le": True}


def memory_target(name, model, bound, minamp):
    a, f = find(minamp, model, "amp", "train"), find(minamp, model, "fp32", "train")
    return {"target": name, "minamp": a and a["peak_bytes"] / 2**20,
            "reference": f and f["peak_bytes"] / 2**20, "unit": "MiB", "bound": bound,
            "ratio": ratio(a and a["peak_bytes"], f and f["peak_bytes"]), "le": True}


def loss_target(name, model, minamp):
    a, f = find(minamp, model, "amp", "train"), find(minamp, model, "fp32", "train")
    la, lf = a and a["loss_last10_mean"], f and f["loss_last10_mean"]
    gap = abs(la - lf) / abs(lf) if la is not None and lf else None
    return {"target": name, "minamp": la, "reference": lf, "unit": "loss", "bound": 0.05,
            "ratio": gap, "le": True, "ratio_is": "|AMP - FP32| / FP32"}


def gemm_target(gemm):
    rows = [r for r in (gemm or {}).get("rows", [])
            if r["shape"] == "square 4096" and r["ab_dtype"] == "f16" and "ratio" in r]
    row = rows[0] if rows else None
    return {"target": "WMMA GEMM 4096^3 vs cublasGemmEx (TFLOP/s)",
            "minamp": row and row["minamp"]["tflops"], "reference": row and row["cublas"]["tflops"],
            "unit": "TFLOP/s", "bound": 0.5, "ratio": row and row["ratio"], "le": False}


def cpu_targets(minamp, pytorch):
    size = minamp.get("sine_size", 64)
    return [
        step_target(f"sine {size}^2 FP32 step vs PyTorch CPU eager FP32",
                    ("sine", "fp32", "train"), ("sine", "fp32", "train"), 1.0, minamp, pytorch),
        step_target("mlp FP32 step vs PyTorch CPU eager FP32", ("mlp", "fp32", "train"),
                    ("mlp", "fp32", "train"), 1.0, minamp, pytorch),
        memory_target(f"sine {size}^2 AMP peak memory vs minamp FP32", "sine", 0.55, minamp),
        loss_target("sine AMP final loss vs FP32 (last-10 mean)", "sine", minamp),
        loss_target("mlp AMP final loss vs FP32 (last-10 mean)", "mlp", minamp),
    ]


def gpu_targets(minamp, pytorch, gemm):
    size = minamp.get("sine_size", 512)
    return [
        gemm_target(gemm),
        step_target(f"sine {size}^2 AMP step vs PyTorch eager AMP", ("sine", "amp", "train"),
                    ("sine", "amp", "train"), 0.8, minamp, pytorch),
        step_target("mlp AMP step vs PyTorch eager AMP", ("mlp", "amp", "train"),
                    ("mlp", "amp", "train"), 0.2, minamp, pytorch),
        memory_target(f"sine {size}^2 AMP peak memory vs minamp FP32", "sine", 0.55, minamp),
        loss_target("sine AMP final loss vs FP32 (last-10 mean)", "sine", minamp),
        loss_target("mlp AMP final loss vs FP32 (last-10 mean)", "mlp", minamp),
    ]


def verdict(row):
    if row["ratio"] is None:
        return "not measured"
    met = row["ratio"] <= row["bound"] if row["le"] else row["ratio"] >= row["bound"]
    return "met" if met else "missed"


def fmt(value, digits=4):
    if value is None:
        return "n/a"
    return f"{value:.{digits}g}"


def target_lines(targets, markdown):
    head = ["target", "minamp", "reference", "ratio", "bound", "status"]
    rows = []
    for t in targets:
        bound = ("<= " if t["le"] else ">= ") + fmt(t["bound"])
        rows.append([t["target"], f"{fmt(t['minamp'])} {t['unit']}",
                     f"{fmt(t['reference'])} {t['unit']}", fmt(t["ratio"], 3), bound, verdict(t)])
    return table(head, rows, markdown)


def comparison_lines(minamp, pytorch, markdown):
    head = ["model", "precision", "mode", "minamp ms (p10-p90)", "PyTorch ms (p10-p90)",
            "minamp / PyTorch", "minamp peak MiB", "PyTorch peak MiB"]
    rows = []
    for run in minamp["runs"]:
        key = (run["model"], run["precision"], run["mode"])
        peer = find(pytorch, *key)
        rows.append(list(key) + [spread(run), spread(peer), fmt(ratio(median(run), median(peer)), 3),
                                 mib(run), mib(peer)])
    return table(head, rows, markdown)


def spread(run):
    if not run:
        return "n/a"
    ms = run["step_ms"]
    return f"{ms['median']:.4g} ({ms['p10']:.4g}-{ms['p90']:.4g})"


def mib(run):
    if not run or run.get("peak_bytes") is None:
        return "n/a"
    return f"{run['peak_bytes'] / 2**20:.3g}"


def gemm_lines(gemm, markdown):
    head = ["shape (MxNxK)", "in/out", "minamp TFLOP/s", "cuBLAS TFLOP/s", "ratio", "check"]
    rows = []
    for r in gemm["rows"]:
        name = f"{r['shape']} ({r['m']}x{r['n']}x{r['k']})"
        dtypes = f"{r['ab_dtype']}/{r['c_dtype']}"
        if "ratio" not in r:
            rows.append([name, dtypes, "-", "-", "-", "FAILED"])
            continue
        rows.append([name, dtypes, f"{r['minamp']['tflops']:.3g}", f"{r['cublas']['tflops']:.3g}",
                     f"{100 * r['ratio']:.1f}%", f"ok ({r['check']['max_rel_diff_vs_cublas']:.1e})"])
    return table(head, rows, markdown)


def table(head, rows, markdown):
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    return ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in [head] + rows]


def render(combined, markdown):
    meta, pt = combined["meta"], combined["pytorch"]
    where = meta.get("gpu") or f"{meta['host_cpu']}, {meta['host_cores']} cores"
    torch_note = (f"PyTorch {pt['torch_version']}, {pt['threads']} threads, TF32 matmul "
                  f"{pt['tf32_matmul']} / cuDNN {pt['tf32_cudnn']}" if pt
                  else f"PyTorch: not run ({meta.get('pytorch_status', 'unknown')})")
    load = meta["load_average_1_5_15_min"]
    lines = [f"Measured on {where}, {meta['date']}, commit {meta['commit']}; minamp "
             f"{combined['minamp']['threads']} threads; {torch_note}; host load average at the "
             f"end {load[0]} / {load[1]} / {load[2]} (1 / 5 / 15 min).", ""]
    lines += target_lines(combined["targets"], markdown) + [""]
    lines += comparison_lines(combined["minamp"], pt, markdown)
    if combined.get("gemm"):
        lines += [""] + gemm_lines(combined["gemm"], markdown)
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--platform", choices=["cpu", "gpu"], required=True)
    p.add_argument("--minamp", nargs="+", required=True, help="bench_train JSON files")
    p.add_argument("--pytorch", nargs="*", help="bench/pytorch/train.py JSON files")
    p.add_argument("--pytorch-status", default="ran", help="why PyTorch did not run, if it did not")
    p.add_argument("--gemm", help="bench_gemm JSON")
    p.add_argument("--commit", help="the commit measured (default: HEAD now)")
    p.add_argument("--log", help="the raw log of this run, recorded by name")
    p.add_argument("--out", required=True, help="combined JSON to write")
    p.add_argument("--markdown", help="Markdown table to write")
    args = p.parse_args()

    minamp, pytorch = load(args.minamp), load(args.pytorch)
    gemm = load_one(args.gemm)
    if minamp is None:
        raise SystemExit("report: no bench_train results to report (see the log)")
    meta = where_and_when(args.platform, args.commit)
    meta["pytorch_status"] = args.pytorch_status
    meta["log"] = args.log and os.path.basename(args.log)
    targets = (cpu_targets(minamp, pytorch) if args.platform == "cpu"
               else gpu_targets(minamp, pytorch, gemm))
    for t in targets:
        t["status"] = verdict(t)
    combined = {"meta": meta, "targets": targets, "minamp": minamp, "pytorch": pytorch,
                "gemm": gemm}
    with open(args.out, "w") as f:
        json.dump(combined, f, indent=2)
        f.write("\n")
    print(render(combined, markdown=False))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(render(combined, markdown=True))
    print(f"wrote {args.out}" + (f" and {args.markdown}" if args.markdown else ""))


if __name__ == "__main__":
    main()
