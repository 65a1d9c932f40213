"""Merges one benchmark run — bench_train's JSON, the PyTorch peer's JSON and (on a GPU)
bench_gemm's JSON — with where and when it ran (device, driver, commit, date), writes the
combined JSON, prints the comparison table with the targets and ratios (and, for bench_gemm's
depth rows, each configuration's time fitted against K), and writes the same tables as Markdown
(bench/NOTES.md and the README quote them). A missing or unreadable input
(a stage that failed or ran out of time) is listed as missing and the rest is still written; with
no results at all it writes nothing and exits 1. Standard library only: it runs beside any Python."""

import argparse
import datetime
import json
import os
import platform
import re
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
    changed = command_output("git", "status", "--porcelain", "--untracked-files=no")
    if changed:
        commit += "-dirty"
    meta = {"platform": platform_name,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit, "host_cpu": cpu_model(), "host_cores": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1_5_15_min": [round(x, 2) for x in os.getloadavg()]}
    if changed:  # what made it -dirty, as git status lists it (the first 20)
        meta["changed_files"] = [line.strip() for line in changed.splitlines()[:20]]
    if platform_name == "gpu":
        gpu = command_output("nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                             "--format=csv,noheader")
        meta["gpu"] = gpu.splitlines()[0] if gpu else "unknown"
        meta["nvcc"] = (command_output("nvcc", "--version") or "unknown").splitlines()[-1]
    return meta


# amp is AMP with f16 (and loss scaling), amp-bf16 AMP with bf16 (without).
MODELS, PRECISIONS, MODES = ("mlp", "sine", "classify"), ("fp32", "amp", "amp-bf16"), \
    ("train", "infer")
# What each platform's bench runs beyond MODELS (bench/run-cpu.sh, bench/run-gpu.sh).
EXTRA_MODELS = {"cpu": ("resnet18",), "gpu": ()}
# Optional modes: minamp's CUDA-graph replay and its training with the batch-norm fusions off,
# PyTorch's other configurations (bench/pytorch/train.py's CONFIGS); listed in this order.
MODE_ORDER = ("train", "train-graph", "train-unfused", "train-nchw", "train-fused",
              "train-nchw-fused", "train-compile", "infer")


def load_one(path, problems):
    """The JSON object at path, or None when there is none (the tool did not run, failed or was
    cut off) or it cannot be read; why it cannot be read is appended to problems."""
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            result = json.load(f)
    except (OSError, ValueError) as error:
        problems.append(f"{os.path.basename(path)}: unreadable ({error})")
        return None
    if not isinstance(result, dict):
        problems.append(f"{os.path.basename(path)}: unreadable (not a JSON object)")
        return None
    return result


def load(paths, problems, items=("runs",)):
    """One result from several files of the same tool: their lists named in items (runs, or
    bench_gemm's rows and skipped sweep configurations) joined and their models merged, every
    other field from the first. None when no file could be read."""
    results = [r for r in (load_one(p, problems) for p in paths or []) if r is not None]
    if not results:
        return None
    merged = dict(results[0], **{key: [] for key in items})
    if "models" in merged:
        merged["models"] = {}
    for r in results:
        for key in items:
            merged[key] += r.get(key, [])
        if "models" in merged:
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


NOT_THE_PAIR = "not the target's pair"


def step_target(name, ours, theirs, bound, minamp, pytorch, info=None):
    """A row comparing minamp's median step time with PyTorch's. An info row (info says why) is
    measured against a target's bound but is not that target, e.g. NOT_THE_PAIR: its two sides
    are not the target's like-for-like pair (minamp replaying a CUDA graph against PyTorch
    eager)."""
    a, b = find(minamp, *ours), find(pytorch, *theirs)
    return {"target": name, "minamp": median(a), "reference": median(b), "unit": "ms",
            "bound": bound, "ratio": ratio(median(a), median(b)), "le": True, "info": info}


def fastest_peer(pytorch, model, precision):
    """PyTorch's fastest training run of model and precision over every configuration it timed
    (modes train, train-nchw, train-fused, ...), or None."""
    runs = [r for r in (pytorch or {}).get("runs", []) if r["model"] == model
            and r["precision"] == precision and r["mode"].startswith("train")
            and "error" not in r]
    return min(runs, key=median, default=None)


def fastest_peer_target(name, model, bound, minamp, pytorch):
    """minamp's AMP training step against the fastest PyTorch AMP configuration; the reference
    names which one it was."""
    a, b = find(minamp, model, "amp", "train"), fastest_peer(pytorch, model, "amp")
    row = {"target": name, "minamp": median(a), "reference": median(b), "unit": "ms",
           "bound": bound, "ratio": ratio(median(a), median(b)), "le": True}
    if b:
        row["reference_mode"] = b["mode"]
    return row


def peer_memory_target(name, model, bound, minamp, pytorch):
    """minamp's AMP training peak against the leanest PyTorch AMP training configuration's."""
    a = find(minamp, model, "amp", "train")
    peaks = [r for r in (pytorch or {}).get("runs", []) if r["model"] == model
             and r["precision"] == "amp" and r["mode"].startswith("train") and "error" not in r
             and r.get("peak_bytes")]
    b = min(peaks, key=lambda r: r["peak_bytes"], default=None)
    pa, pb = a and a.get("peak_bytes"), b and b["peak_bytes"]
    row = {"target": name, "minamp": pa and pa / 2**20, "reference": pb and pb / 2**20,
           "unit": "MiB", "bound": bound, "ratio": ratio(pa, pb), "le": True}
    if b:
        row["reference_mode"] = b["mode"]
    return row


def memory_target(name, model, bound, minamp, precision="amp"):
    a, f = find(minamp, model, precision, "train"), find(minamp, model, "fp32", "train")
    pa, pf = a and a.get("peak_bytes"), f and f.get("peak_bytes")
    return {"target": name, "minamp": pa and pa / 2**20, "reference": pf and pf / 2**20,
            "unit": "MiB", "bound": bound, "ratio": ratio(pa, pf), "le": True}


def loss_target(name, model, minamp, precision="amp", info=None):
    a, f = find(minamp, model, precision, "train"), find(minamp, model, "fp32", "train")
    la, lf = a and a["loss_last10_mean"], f and f["loss_last10_mean"]
    gap = abs(la - lf) / abs(lf) if la is not None and lf else None
    row = {"target": name, "minamp": la, "reference": lf, "unit": "loss", "bound": 0.05,
           "ratio": gap, "le": True, "ratio_is": "|AMP - FP32| / FP32", "info": info}
    if a and f and (la is None or lf is None):  # NaN or inf: bench_train's JSON writes null
        row["not_finite"] = True
    return row


def sine_losses(result, precision):
    """{seed, fp32, amp}: the last-10 mean losses of sine's FP32 and AMP training (AMP in
    `precision`) in one bench_train result (None for a loss that was not finite), or None when it
    lacks either."""
    f, a = find(result, "sine", "fp32", "train"), find(result, "sine", precision, "train")
    if not (f and a):
        return None
    return {"seed": result.get("seed"), "fp32": f["loss_last10_mean"], "amp": a["loss_last10_mean"]}


def seeds_target(minamp, seed_results, precision="amp"):
    """The sine loss figure over every seed bench_train trained sine with: the target's own run
    and the --minamp-seeds runs, each from its own init. One run's last-10 mean moves by 20% or
    more with the init in FP32 alone (bench/NOTES.md), so the mean over seeds shows what one init
    cannot: whether AMP trains as well as FP32. For AMP (f16) an info row beside the target, which
    stays the one run's; for AMP-bf16 the target itself. None with fewer than two seeds."""
    by_seed = [s for s in (sine_losses(r, precision) for r in [minamp] + seed_results) if s]
    if len(by_seed) < 2:
        return None
    seeds = ", ".join(str(s["seed"]) for s in by_seed)
    label = "AMP" if precision == "amp" else "AMP-bf16"
    row = {"target": f"sine {label} final loss vs FP32, mean over seeds {seeds} (last-10 means)",
           "minamp": None, "reference": None, "unit": "loss", "bound": 0.05, "ratio": None,
           "le": True, "ratio_is": f"|{label} - FP32| / FP32 of the means over seeds",
           "info": "the target over seeds" if precision == "amp" else None, "by_seed": by_seed,
           "label": label}
    if any(s["fp32"] is None or s["amp"] is None for s in by_seed):
        row["not_finite"] = True
        return row
    row["minamp"] = sum(s["amp"] for s in by_seed) / len(by_seed)
    row["reference"] = sum(s["fp32"] for s in by_seed) / len(by_seed)
    row["ratio"] = abs(row["minamp"] - row["reference"]) / row["reference"]
    return row


def is_library(row):
    """A row of the library's GEMM, not of a version forced or a configuration of the sweep."""
    return row.get("config", "library") == "library"


def gemm_row(gemm, shape, config="library"):
    """bench_gemm's f16 row of `shape` for `config` (the library, or a version: "v2"), or None."""
    rows = [r for r in (gemm or {}).get("rows", []) if r["shape"] == shape
            and r["ab_dtype"] == "f16" and r.get("config", "library") == config]
    return rows[0] if rows else None


def gemm_target(gemm, shape, name, bound):
    """The library's f16 GEMM on `shape` against cublasGemmEx, TFLOP/s, at least `bound`."""
    checked = gemm_row(gemm, shape)
    row = checked if checked and "ratio" in checked else None  # bench_gemm times only what passes
    target = {"target": name, "minamp": row and row["minamp"]["tflops"],
              "reference": row and row["cublas"]["tflops"], "unit": "TFLOP/s", "bound": bound,
              "ratio": row and row["ratio"], "le": False}
    if checked and not row:
        target["check_failed"] = True
    return target


CLASSIFY_CONVS = ("classify conv1", "classify conv2", "classify conv3", "classify conv4")


def conv_gemm_target(gemm):
    """The classifier's conv GEMMs: the library against v2 (the WMMA kernel the library ran before
    the mma.sync versions) in the same run, the slowest ratio over the shapes: at least 1 means
    no shape got slower."""
    pairs = [(gemm_row(gemm, s), gemm_row(gemm, s, "v2")) for s in CLASSIFY_CONVS]
    timed = [(a, b) for a, b in pairs if a and b and "ratio" in a and "ratio" in b]
    worst = min(timed, key=lambda p: p[0]["minamp"]["tflops"] / p[1]["minamp"]["tflops"],
                default=None)
    target = {"target": "classify conv GEMMs, slowest library / v2 (TFLOP/s)",
              "minamp": worst and worst[0]["minamp"]["tflops"],
              "reference": worst and worst[1]["minamp"]["tflops"], "unit": "TFLOP/s",
              "bound": 1.0, "ratio": worst and worst[0]["minamp"]["tflops"] /
              worst[1]["minamp"]["tflops"], "le": False}
    if any(a and "ratio" not in a for a, _ in pairs):
        target["check_failed"] = True
    return target


# Sine's AMP step floor (bench/NOTES.md, "Sine's AMP step: where it goes, its floor"): the GEMMs
# of its two 256-channel convs (forward, input and weight gradient, 2 x pixels x 256 x 256 FLOPs
# each) at the rates cuBLAS ran sine's shapes in the same run, plus the activation traffic that
# keeping one activation a batch norm leaves, SINE_FLOOR_PASSES passes over a [pixels, 256] f16
# tensor, at device memory's copy rate (bench_gemm's `copy`).
SINE_HIDDEN = 256
SINE_FLOOR_GEMMS = ("sine fwd", "sine dgrad", "sine wgrad")
SINE_FLOOR_PASSES = 18
FLOOR_INFO = "reported, no bound"


def sine_floor_ms(gemm, size):
    """The floor of sine's AMP step on a size x size grid in ms, or None without its figures."""
    rows = [gemm_row(gemm, shape) for shape in SINE_FLOOR_GEMMS]
    copy = (gemm or {}).get("copy")
    if not copy or not all(r and "cublas" in r for r in rows):
        return None
    pixels = size * size
    flops = 2 * pixels * SINE_HIDDEN * SINE_HIDDEN  # one GEMM; each shape runs twice a step
    gemm_s = sum(2 * flops / (r["cublas"]["tflops"] * 1e12) for r in rows)
    bytes_moved = SINE_FLOOR_PASSES * pixels * SINE_HIDDEN * 2
    return (gemm_s + bytes_moved / (copy["gb_per_s"] * 1e9)) * 1e3


def floor_target(name, minamp, gemm, size):
    """minamp's sine AMP step over its floor: a figure to report, with no bound."""
    a = find(minamp, "sine", "amp", "train")
    floor = sine_floor_ms(gemm, size)
    return {"target": name, "minamp": median(a), "reference": floor, "unit": "ms", "bound": None,
            "ratio": ratio(median(a), floor), "le": True, "info": FLOOR_INFO}


def gemm_targets(gemm):
    return [
        gemm_target(gemm, "square 4096", "GEMM 4096^3 vs cublasGemmEx (TFLOP/s)", 0.6),
        gemm_target(gemm, "square 1024", "GEMM 1024^3 vs cublasGemmEx (TFLOP/s)", 0.5),
        gemm_target(gemm, "sine fwd", "sine forward GEMM 262144x256x256 vs cublasGemmEx (TFLOP/s)",
                    0.6),
        conv_gemm_target(gemm),
    ]


ONE_SEED = "one seed; the target is the mean over seeds"


def bf16_targets(minamp, size):
    """AMP-bf16's memory and losses against FP32, as AMP's: the sine loss of one seed is an info
    row, its target being the mean over seeds (seeds_target)."""
    return [
        memory_target(f"sine {size}^2 AMP-bf16 peak memory vs minamp FP32", "sine", 0.55, minamp,
                      "amp-bf16"),
        loss_target("sine AMP-bf16 final loss vs FP32 (last-10 mean)", "sine", minamp, "amp-bf16",
                    ONE_SEED),
        loss_target("mlp AMP-bf16 final loss vs FP32 (last-10 mean)", "mlp", minamp, "amp-bf16"),
    ]


def cpu_targets(minamp, pytorch):
    size = (minamp or pytorch or {}).get("sine_size", 64)
    return [
        step_target(f"sine {size}^2 FP32 step vs PyTorch CPU eager FP32",
                    ("sine", "fp32", "train"), ("sine", "fp32", "train"), 1.0, minamp, pytorch),
        step_target("mlp FP32 step vs PyTorch CPU eager FP32", ("mlp", "fp32", "train"),
                    ("mlp", "fp32", "train"), 1.0, minamp, pytorch),
        step_target("resnet18 FP32 forward, batch 1, 224^2, vs PyTorch CPU eager FP32",
                    ("resnet18", "fp32", "infer"), ("resnet18", "fp32", "infer"), 1.0, minamp,
                    pytorch),
        memory_target(f"sine {size}^2 AMP peak memory vs minamp FP32", "sine", 0.55, minamp),
        loss_target("sine AMP final loss vs FP32 (last-10 mean)", "sine", minamp),
        loss_target("mlp AMP final loss vs FP32 (last-10 mean)", "mlp", minamp),
    ] + bf16_targets(minamp, size)


def gpu_targets(minamp, pytorch, gemm):
    size = (minamp or pytorch or {}).get("sine_size", 512)
    return gemm_targets(gemm) + [
        fastest_peer_target(f"sine {size}^2 AMP step vs the fastest PyTorch AMP configuration",
                            "sine", 0.6, minamp, pytorch),
        floor_target(f"sine {size}^2 AMP step vs its floor (GEMMs at cuBLAS's rate, "
                     f"{SINE_FLOOR_PASSES} activation passes at the copy rate)", minamp, gemm,
                     size),
        fastest_peer_target("classify AMP step vs the fastest PyTorch AMP configuration",
                            "classify", 0.5, minamp, pytorch),
        peer_memory_target(f"sine {size}^2 AMP peak memory vs the leanest PyTorch AMP "
                           "configuration", "sine", 0.7, minamp, pytorch),
        # ResNet-50's target is images/s >= 0.8 of PyTorch's: a step time <= 1 / 0.8 of its.
        fastest_peer_target("resnet50 AMP step vs the fastest PyTorch AMP configuration",
                            "resnet50", 1.25, minamp, pytorch),
        peer_memory_target("resnet50 AMP peak memory vs the leanest PyTorch AMP configuration",
                           "resnet50", 1.0, minamp, pytorch),
        step_target("mlp AMP step vs PyTorch eager AMP", ("mlp", "amp", "train"),
                    ("mlp", "amp", "train"), 0.2, minamp, pytorch),
        step_target("mlp AMP step replayed from a CUDA graph vs PyTorch eager AMP",
                    ("mlp", "amp", "train-graph"), ("mlp", "amp", "train"), 0.2, minamp, pytorch,
                    info=NOT_THE_PAIR),
        step_target(f"sine {size}^2 AMP step replayed from a CUDA graph vs PyTorch eager AMP",
                    ("sine", "amp", "train-graph"), ("sine", "amp", "train"), 0.6, minamp,
                    pytorch, info=NOT_THE_PAIR),
        memory_target(f"sine {size}^2 AMP peak memory vs minamp FP32", "sine", 0.55, minamp),
        loss_target("sine AMP final loss vs FP32 (last-10 mean)", "sine", minamp),
        loss_target("mlp AMP final loss vs FP32 (last-10 mean)", "mlp", minamp),
        # bf16 and f16 run on the tensor cores at the same rate: bf16 should cost no more.
        step_target(f"sine {size}^2 AMP-bf16 step vs minamp AMP-f16", ("sine", "amp-bf16", "train"),
                    ("sine", "amp", "train"), 1.05, minamp, minamp),
    ] + bf16_targets(minamp, size)


def verdict(row):
    if row.get("not_finite"):
        return "missed (loss not finite)"
    if row.get("check_failed"):
        return "missed (its result check failed)"
    if row["ratio"] is None:
        return "not measured"
    if row.get("info"):
        return f"info ({row['info']})"
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
        bound = "none" if t["bound"] is None else ("<= " if t["le"] else ">= ") + fmt(t["bound"])
        reference = f"{fmt(t['reference'])} {t['unit']}"
        if t.get("reference_mode"):
            reference += f" ({t['reference_mode']})"
        rows.append([t["target"], f"{fmt(t['minamp'])} {t['unit']}", reference,
                     fmt(t["ratio"], 3), bound, verdict(t)])
    return table(head, rows, markdown) + by_seed_lines(targets)


def by_seed_lines(targets):
    """Under the targets: each seed's AMP / FP32 ratio of the rows over seeds, if there are any."""
    lines = []
    for t in targets:
        if "by_seed" in t:
            ratios = [f"seed {s['seed']} {fmt(ratio(s['amp'], s['fp32']), 3)}"
                      for s in t["by_seed"]]
            lines.append(f"sine {t['label']} / FP32 loss (last-10 means) by seed: "
                         + ", ".join(ratios) + ".")
    return [""] + lines if lines else []


def rank(known, value):
    return known.index(value) if value in known else len(known)


def comparison_lines(minamp, pytorch, markdown):
    head = ["model", "precision", "mode", "minamp ms (p10-p90)", "PyTorch ms (p10-p90)",
            "minamp / PyTorch", "minamp peak MiB", "PyTorch peak MiB"]
    rows, keys = [], []
    for result in (minamp, pytorch):  # minamp's runs, then any only PyTorch has
        for run in (result or {}).get("runs", []):
            key = (run["model"], run["precision"], run["mode"])
            if "error" not in run and key not in keys:
                keys.append(key)
    models = [key[0] for key in keys]  # each model in its first place, FP32 before AMP in it
    keys.sort(key=lambda k: (models.index(k[0]), rank(PRECISIONS, k[1]), rank(MODE_ORDER, k[2])))
    for key in keys:
        run, peer = find(minamp, *key), find(pytorch, *key)
        time_ratio = fmt(ratio(median(run), median(peer)), 3)
        rows.append(list(key) + [spread(run), spread(peer), time_ratio, mib(run), mib(peer)])
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
        if not is_library(r):  # a version's or a sweep configuration's row: under its shape's
            name = f"{r['shape']}, {r['config']}"
        dtypes = f"{r['ab_dtype']}/{r['c_dtype']}"
        if "ratio" not in r:
            rows.append([name, dtypes, "-", "-", "-", "FAILED"])
            continue
        # NaN and inf are null in bench_gemm's JSON: shown as n/a
        percent = "n/a" if r["ratio"] is None else f"{100 * r['ratio']:.1f}%"
        diff = r["check"]["max_rel_diff_vs_cublas"]
        rows.append([name, dtypes, fmt(r["minamp"]["tflops"], 3), fmt(r["cublas"]["tflops"], 3),
                     percent, "ok" if diff is None else f"ok ({diff:.1e})"])
    skipped = [f"sweep: {why}" for why in gemm.get("sweep_skipped", [])]
    return table(head, rows, markdown) + ([""] + skipped if skipped else [])


DEPTH_SHAPE = re.compile(r"^(?P<shape>.+) K=(?P<k>\d+)$")


def depth_fits(gemm):
    """bench_gemm's depth rows (one shape at several K: "sine fwd K=64", ...) fitted, for each
    shape, input type and configuration, by least squares to t = fixed + per_64 K / 64 (µs, the
    median time of a run): `fixed` is what a launch costs whatever K (its tiles' prologue and
    epilogue, the launch), `per_64` what each 64 of K adds (the main loop). Rows whose check failed
    have no time and are left out; a configuration timed at fewer than two K is not fitted."""
    groups = {}
    for r in (gemm or {}).get("rows", []):
        match = DEPTH_SHAPE.match(r["shape"])
        if match and "minamp" in r:
            key = (match["shape"], r["ab_dtype"], r.get("config", "library"))
            groups.setdefault(key, []).append((int(match["k"]), 1000 * r["minamp"]["median_ms"]))
    fits = []
    for (shape, ab_dtype, config), points in groups.items():
        ks = sorted({k for k, _ in points})
        if len(ks) < 2:
            continue
        x, y = [k / 64 for k, _ in points], [t for _, t in points]
        mean_x, mean_y = sum(x) / len(x), sum(y) / len(y)
        per_64 = (sum((a - mean_x) * (b - mean_y) for a, b in zip(x, y))
                  / sum((a - mean_x) ** 2 for a in x))
        fixed = mean_y - per_64 * mean_x
        worst = max(abs(fixed + per_64 * a - b) / b for a, b in zip(x, y))
        fits.append({"shape": shape, "ab_dtype": ab_dtype, "config": config, "k": ks,
                     "fixed_us": fixed, "per_64_k_us": per_64, "worst_fit_error": worst})
    return fits


def depth_lines(fits, markdown):
    head = ["shape", "in", "configuration", "K", "fixed µs", "µs per 64 of K", "worst fit error"]
    rows = [[f["shape"], f["ab_dtype"], f["config"], ", ".join(str(k) for k in f["k"]),
             fmt(f["fixed_us"], 3), fmt(f["per_64_k_us"], 3),
             f"{100 * f['worst_fit_error']:.1f}%"] for f in fits]
    return ["Time against K (depth rows): t = fixed + K / 64 x (µs per 64 of K), least squares.",
            ""] + table(head, rows, markdown)


def table(head, rows, markdown):
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    return ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in [head] + rows]


def missing_results(minamp, pytorch, gemm, platform_name):
    """What this run lacks: each model / precision / mode a tool did not report (the platform's
    models in FP32, AMP and AMP-bf16 are expected), the runs that failed, and on a GPU bench_gemm."""
    missing = []
    for tool, result in (("minamp", minamp), ("PyTorch", pytorch)):
        errors = [r for r in (result or {}).get("runs", []) if "error" in r]
        failed = {(r["model"], r["precision"]) for r in errors if r["mode"] in MODES}
        for model in MODELS + EXTRA_MODELS.get(platform_name, ()):
            absent = [f"{p} {m}" for p in PRECISIONS for m in MODES
                      if (model, p) not in failed and not find(result, model, p, m)]
            if len(absent) == len(PRECISIONS) * len(MODES):
                missing.append(f"{tool} {model}: no results")
            elif absent:
                missing.append(f"{tool} {model}: no {', '.join(absent)}")
        missing += [f"{tool} {r['model']} {r['precision']} {r['mode']}: failed ({r['error']})"
                    for r in errors]
    if platform_name == "gpu" and not gemm:
        missing.append("bench_gemm: no results")
    return missing


def peer_notes(pytorch):
    """What the PyTorch columns include, where a run needs saying so."""
    runs = (pytorch or {}).get("runs", [])
    notes = []
    workspace = max((r.get("cublas_workspace_bytes") or 0 for r in runs), default=0)
    if workspace:
        notes.append(f"PyTorch's peaks leave out cuBLAS's workspace ({workspace / 2**20:.3g} MiB "
                     "at most, held from the first GEMM on; minamp calls no cuBLAS).")
    if any(r.get("mode", "train") != "train" and r["mode"].startswith("train") for r in runs):
        notes.append("PyTorch's train is eager, channels_last, with torch.optim's default "
                     "optimizers, whose AMP step reads found_inf on the host; train-nchw runs "
                     "NCHW, the -fused modes use fused=True (which does not read it), "
                     "train-compile is torch.compile's default mode with fused optimizers (its "
                     "compiling first step is not timed). A target against the fastest or leanest "
                     "configuration names it.")
    return ["", " ".join(notes)] if notes else []


def render(combined, markdown):
    meta, pt, minamp = combined["meta"], combined["pytorch"], combined["minamp"]
    where = meta.get("gpu") or f"{meta['host_cpu']}, {meta['host_cores']} cores"
    torch_note = (f"PyTorch {pt['torch_version']}, {pt['threads']} threads, TF32 matmul "
                  f"{pt['tf32_matmul']} / cuDNN {pt['tf32_cudnn']}" if pt
                  else f"PyTorch: not run ({meta.get('pytorch_status', 'unknown')})")
    minamp_note = f"minamp {minamp['threads']} threads" if minamp else "minamp: no results"
    load = meta["load_average_1_5_15_min"]
    lines = [f"Measured on {where}, {meta['date']}, commit {meta['commit']}; {minamp_note}; "
             f"{torch_note}; host load average at the end {load[0]} / {load[1]} / {load[2]} "
             f"(1 / 5 / 15 min).", ""]
    if meta.get("missing"):
        lines += ["Missing from this run (see the log): " + "; ".join(meta["missing"]) + ".", ""]
    lines += target_lines(combined["targets"], markdown) + [""]
    lines += comparison_lines(minamp, pt, markdown)
    lines += peer_notes(pt)
    if combined.get("gemm"):
        lines += [""] + gemm_lines(combined["gemm"], markdown)
    if combined.get("depth_fits"):
        lines += [""] + depth_lines(combined["depth_fits"], markdown)
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--platform", choices=["cpu", "gpu"], required=True)
    p.add_argument("--minamp", nargs="*",
                   help="bench_train JSON files (none: bench_gemm's results alone, the models "
                        "listed as missing)")
    p.add_argument("--minamp-seeds", nargs="*",
                   help="bench_train JSON files of sine trained from other seeds")
    p.add_argument("--pytorch", nargs="*", help="bench/pytorch/train.py JSON files")
    p.add_argument("--pytorch-status", help="why PyTorch did not run, if it did not")
    p.add_argument("--gemm", nargs="*", help="bench_gemm JSON files (their rows in this order)")
    p.add_argument("--commit", help="the commit measured (default: HEAD now)")
    p.add_argument("--log", help="the raw log of this run, recorded by name")
    p.add_argument("--out", required=True, help="combined JSON to write")
    p.add_argument("--markdown", help="Markdown table to write")
    args = p.parse_args()

    problems = []
    minamp, pytorch = load(args.minamp, problems), load(args.pytorch, problems)
    gemm = load(args.gemm, problems, items=("rows", "sweep_skipped"))
    if gemm:  # some of bench_gemm's parts, not all
        problems += [f"bench_gemm: no {os.path.basename(p)}" for p in args.gemm
                     if not os.path.exists(p)]
    meta = where_and_when(args.platform, args.commit)
    meta["pytorch_status"] = args.pytorch_status or ("ran" if pytorch else "no results")
    meta["log"] = args.log and os.path.basename(args.log)
    meta["missing"] = problems + missing_results(minamp, pytorch, gemm, args.platform)
    if not (minamp or pytorch or gemm):
        raise SystemExit("report: no results at all, nothing written; missing: "
                         + "; ".join(meta["missing"]))
    targets = (cpu_targets(minamp, pytorch) if args.platform == "cpu"
               else gpu_targets(minamp, pytorch, gemm))
    seed_results = [load_one(path, problems) for path in args.minamp_seeds or []]
    for precision in ("amp", "amp-bf16"):
        over_seeds = seeds_target(minamp, [r for r in seed_results if r is not None], precision)
        if over_seeds:
            targets.append(over_seeds)
    for t in targets:
        t["status"] = verdict(t)
    combined = {"meta": meta, "targets": targets, "minamp": minamp, "pytorch": pytorch,
                "gemm": gemm, "depth_fits": depth_fits(gemm)}
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
