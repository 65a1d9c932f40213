"""The PyTorch peer of bench_train: the same models (models.py), eager FP32, eager AMP
(torch.autocast + torch.amp.GradScaler) and eager AMP-bf16 (torch.autocast(dtype=torch.bfloat16),
no GradScaler), timed the same way — warm-up steps, then each step
timed by the wall clock with the device synchronised before each clock read; median, p10, p90 —
plus forward-only inference, peak memory and the final loss. --configs adds the other training
configurations a PyTorch user would reach for (CONFIGS: NCHW, fused optimizers, both,
torch.compile), each a mode of its own, so that a comparison can take the fastest. Writes JSON
with the torch version, the TF32 flags and the thread count."""

import argparse
import collections
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


def percentile(sorted_values, q):
    """Linear interpolation between order statistics (numpy.percentile's default)."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo])


def summarize_ms(ms):
    s = sorted(ms)
    return {"median": percentile(s, 0.5), "p10": percentile(s, 0.1), "p90": percentile(s, 0.9),
            "min": s[0], "max": s[-1], "mean": sum(s) / len(s), "n": len(s)}


class Device:
    """Synchronisation and peak-memory counters of one device."""

    def __init__(self, name):
        self.name = name
        self.cuda = name == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def reset_peak(self):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def peak(self, data_bytes):
        """The peak allocated bytes since reset_peak minus the resident batches and minus the
        cuBLAS workspace that PyTorch's allocator holds from the first GEMM on (minamp uses no
        cuBLAS; the workspace is recorded on its own); None on the CPU (PyTorch keeps no
        allocator statistics there)."""
        if not self.cuda:
            return {"peak_bytes": None}
        peak = torch.cuda.max_memory_allocated()
        workspace = self.cublas_workspace_bytes()
        return {"peak_bytes": peak - data_bytes - workspace, "cublas_workspace_bytes": workspace}

    @staticmethod
    def cublas_workspace_bytes():
        """Measured by freeing the workspaces (the next GEMM allocates them again); 0 where
        this torch has no way to free them."""
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is None:
            return 0
        before = torch.cuda.memory_allocated()
        clear()
        return before - torch.cuda.memory_allocated()


def time_each(iterations, body, device):
    ms = []
    for i in range(iterations):
        start = time.perf_counter()
        body(i)
        device.sync()
        ms.append((time.perf_counter() - start) * 1e3)
    return ms


# Each precision bench_train measures: whether it autocasts, to which dtype, and whether its loss
# is scaled (f16 only, as PyTorch users train bf16).
PRECISIONS = {"fp32": (False, torch.float16, False), "amp": (True, torch.float16, True),
              "amp-bf16": (True, torch.bfloat16, False)}


def autocast(device, precision):
    amp, dtype, _ = PRECISIONS[precision]
    return torch.autocast(device.name, dtype=dtype, enabled=amp)


def training_step(w, opt, scaler, precision, device):
    def step(i):
        b = i % len(w.inputs)
        opt.zero_grad()
        with autocast(device, precision):
            loss = w.loss(w.model(w.inputs[b]), w.targets[b])
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    return step


# The training configurations, by mode: the conv nets' memory format, the optimizer's
# implementation (fused=True: the AMP step reads found_inf on the GPU, where GradScaler.step of the
# default optimizers copies it to the host every step to decide whether to skip), and whether the
# model runs through torch.compile (default mode; its first step, which compiles, is timed on
# its own as compile_s; AMP only). "train" is eager, channels_last (minamp's NHWC), default
# optimizers.
CONFIGS = {
    "train": {"channels_last": True, "fused": False, "compile": False},
    "train-nchw": {"channels_last": False, "fused": False, "compile": False},
    "train-fused": {"channels_last": True, "fused": True, "compile": False},
    "train-nchw-fused": {"channels_last": False, "fused": True, "compile": False},
    "train-compile": {"channels_last": True, "fused": True, "compile": True},
}


def train_run(w, precision, args, device, label, mode="train"):
    """Training in `precision` (PRECISIONS) and configuration `mode` (CONFIGS)."""
    config = CONFIGS[mode]
    opt = w.make_optimizer(w.model.parameters(), **({"fused": True} if config["fused"] else {}))
    scaler = torch.amp.GradScaler(device.name, enabled=PRECISIONS[precision][2])
    if config["compile"]:
        w.model = torch.compile(w.model)
    step = training_step(w, opt, scaler, precision, device)
    print(f"  {label:<22} {mode}: {args.warmup} warm-up + {args.steps} timed steps", flush=True)
    start = time.perf_counter()
    step(0)
    device.sync()
    first_step_s = time.perf_counter() - start
    for i in range(1, args.warmup):
        step(i)
    device.sync()
    device.reset_peak()
    losses = collections.deque(maxlen=10)  # as bench/train.cpp: a list would keep every step's
    ms = time_each(args.steps, lambda i: losses.append(step(args.warmup + i)), device)
    peak = device.peak(w.data_bytes())
    tail = [float(x) for x in losses]
    run = {"model": w.name, "precision": precision, "mode": mode,
           "warmup": args.warmup, "steps": args.steps, "step_ms": summarize_ms(ms),
           **peak, "data_bytes": w.data_bytes(), "final_loss": float(losses[-1]),
           "loss_last10_mean": sum(tail) / len(tail), "final_scale": scaler.get_scale()}
    if config["compile"]:
        run["compile_s"] = first_step_s
    return run


def inference_run(w, precision, args, device, label):
    print(f"  {label:<22} inference: 3 warm-up + {args.infer_steps} timed passes", flush=True)
    w.model.eval()

    def forward(_):
        with torch.no_grad(), autocast(device, precision):
            w.model(w.inputs[0])

    for i in range(3):
        forward(i)
    device.sync()
    device.reset_peak()
    ms = time_each(args.infer_steps, forward, device)
    peak = device.peak(w.data_bytes())
    w.model.train()
    return {"model": w.name, "precision": precision, "mode": "infer",
            "warmup": 3, "steps": args.infer_steps, "step_ms": summarize_ms(ms),
            **peak, "data_bytes": w.data_bytes()}


def print_run(run):
    ms = run["step_ms"]
    peak = "n/a" if run["peak_bytes"] is None else f"{run['peak_bytes'] / 1048576:8.2f} MiB"
    line = (f"  {run['model']:<8} {run['precision']:<8} {run['mode']:<16} median "
            f"{ms['median']:9.3f} ms  (p10 {ms['p10']:.3f}, p90 {ms['p90']:.3f})  peak {peak}")
    if "final_loss" in run:
        tail = min(run["steps"], 10)
        line += f"  loss {run['final_loss']:.6g} (last-{tail} mean {run['loss_last10_mean']:.6g})"
    print(line, flush=True)


def run_error(name, precision, mode, error):
    return {"model": name, "precision": precision, "mode": mode, "error": str(error)}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--models", default="mlp,sine,classify")
    p.add_argument("--precisions", default="fp32,amp,amp-bf16")
    p.add_argument("--steps", type=int, default=100, help="timed training steps")
    p.add_argument("--warmup", type=int, default=10, help="untimed training steps first")
    p.add_argument("--infer-steps", type=int, default=20, help="timed forward-only passes")
    p.add_argument("--size", type=int, default=0, help="sine grid (0: 512 on cuda, 64 on cpu)")
    p.add_argument("--resnet-size", type=int, default=0,
                   help="ResNet image side (0: 224 on cuda, 64 on cpu)")
    p.add_argument("--resnet-batch", type=int, default=0,
                   help="ResNet images per batch (0: 64 on cuda, 4 on cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch CPU threads")
    p.add_argument("--configs", default="",
                   help="also train in these configurations (modes train-<name>), comma-separated "
                        "from: " + ", ".join(m[len("train-"):] for m in CONFIGS if m != "train"))
    p.add_argument("--json", help="write the results to this JSON file")
    args = p.parse_args()
    extra = tuple(m[len("train-"):] for m in CONFIGS if m != "train")
    for option, value, accepted in (("--models", args.models, models.MODELS),
                                    ("--precisions", args.precisions, tuple(PRECISIONS)),
                                    ("--configs", args.configs, extra)):
        unknown = [v for v in value.split(",") if v and v not in accepted]
        if unknown:
            p.error(f"{option}: unknown value {unknown[0]!r} (expected {', '.join(accepted)})")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.size == 0:
        args.size = 512 if args.device == "cuda" else 64
    if args.resnet_size == 0:
        args.resnet_size = 224 if args.device == "cuda" else 64
    if args.resnet_batch == 0:
        args.resnet_batch = 64 if args.device == "cuda" else 4
    return args


def environment(args):
    env = {"framework": "pytorch", "torch_version": torch.__version__,
           "device": args.device, "threads": torch.get_num_threads(),
           "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
           "tf32_cudnn": torch.backends.cudnn.allow_tf32,
           "float32_matmul_precision": torch.get_float32_matmul_precision(),
           "cuda_matmul_fp32_precision": getattr(torch.backends.cuda.matmul, "fp32_precision",
                                                 None),
           "cudnn_benchmark": torch.backends.cudnn.benchmark,
           "mode": "eager (train, train-nchw, train-fused, train-nchw-fused) or torch.compile "
                   "(train-compile)",
           "memory_format": "channels_last for the conv nets (NCHW in the -nchw modes)",
           "sine_size": args.size, "seed": args.seed,
           "resnet": {"size": args.resnet_size, "batch": args.resnet_batch, "width": 64},
           "timing": "wall clock per step, device synchronised before each clock read",
           "optimizer_impl": ("torch.optim defaults (GradScaler.step reads found_inf on the host "
                              "every AMP step); fused=True in the -fused and -compile modes"),
           "configs": {m: c for m, c in CONFIGS.items()
                       if m == "train" or m[len("train-"):] in args.configs.split(",")},
           "peak_memory": ("torch.cuda.max_memory_allocated over the timed steps, minus the "
                           "resident batches and the cuBLAS workspace (cublas_workspace_bytes)"
                           if args.device == "cuda"
                           else "n/a: PyTorch keeps no CPU allocator statistics")}
    if args.device == "cuda":
        env["device_name"] = torch.cuda.get_device_name()
        env["cuda_version"] = torch.version.cuda
        env["cudnn_version"] = torch.backends.cudnn.version()
    return env


def run_all(args, device, save):
    """Each model and precision: training then inference on one workload, then (with --configs,
    after both precisions) training in each other configuration on a fresh one (mlp, which has no
    convs, skips the NCHW ones). A workload is dropped before the next is built, so that no other
    run's model or batches are resident while a peak is measured. save(info, runs) follows every
    run, so that a run cut short (a time limit, a crash in a library) keeps the ones before it."""
    runs, info = [], {}

    def measure(name, precision, label, parts, channels_last=True):
        """parts: (mode, function of the workload returning its run), run in order; a failing
        part is recorded under its mode and ends the list."""
        w = models.build(name, args.device, args.seed, args.size, channels_last,
                         args.resnet_size, args.resnet_batch)
        for mode, part in parts:
            try:
                runs.append(part(w))
                print_run(runs[-1])
                save(info, runs)
            except Exception as error:  # e.g. an op without an f16 kernel, a compiler missing
                print(f"  {label} {mode}: failed: {error}", flush=True)
                runs.append(run_error(name, precision, mode, error))
                save(info, runs)
                return

    for name in args.models.split(","):
        w = models.build(name, args.device, args.seed, args.size,
                         resnet_size=args.resnet_size, resnet_batch=args.resnet_batch)
        info[name] = {"description": w.description, "optimizer": w.optimizer}
        del w
        for precision in args.precisions.split(","):
            label = f"{name} {precision} {args.device}"
            measure(name, precision, label, [
                ("train", lambda w: train_run(w, precision, args, device, label)),
                ("infer", lambda w: inference_run(w, precision, args, device, label))])
        for config in (c for c in args.configs.split(",") if c):
            mode = "train-" + config
            if name == "mlp" and not CONFIGS[mode]["channels_last"]:
                continue  # no convs: the same as its channels_last configuration
            for precision in args.precisions.split(","):
                if CONFIGS[mode]["compile"] and precision != "amp":
                    continue  # compiling takes 20-100 s; only the AMP targets compare with it
                label = f"{name} {precision} {args.device}"
                measure(name, precision, label,
                        [(mode, lambda w: train_run(w, precision, args, device, label, mode))],
                        CONFIGS[mode]["channels_last"])
    return info, runs


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    device = Device(args.device)
    print(f"pytorch {torch.__version__} on {args.device} ({torch.get_num_threads()} threads): "
          f"{args.warmup} warm-up + {args.steps} timed steps, sine {args.size}x{args.size}",
          flush=True)
    env = environment(args)

    def save(info, runs):
        if args.json:
            with open(args.json + ".tmp", "w") as f:
                json.dump(dict(env, models=info, runs=runs), f, indent=2)
                f.write("\n")
            os.replace(args.json + ".tmp", args.json)

    info, runs = run_all(args, device, save)
    save(info, runs)
    if args.json:
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
