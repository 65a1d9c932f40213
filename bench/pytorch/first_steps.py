"""PyTorch AMP's first steps on sine from minamp's initial weights: loads the weights file that
`sine --save-weights DIR` writes (DIR/init.safetensors, PyTorch's state_dict layout), trains
the same model on the same grid with torch.autocast (fp16) + torch.amp.GradScaler + Adam, and
prints each step's loss, the loss scale it ran with, whether GradScaler skipped it, and which
parameters' gradients were inf or NaN. Set beside minamp's metrics.csv from the same weights, it
shows where the two AMP implementations part: PyTorch materialises each weight gradient in fp16
(the gradient of the weight's fp16 autocast copy), minamp writes it in fp32 from the GEMM's
accumulators.

    build/sine --amp --steps 8 --save-weights /tmp/w --out /tmp/w/minamp
    python3 bench/pytorch/first_steps.py --weights /tmp/w/init.safetensors --steps 8
"""

import argparse
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

SAFETENSORS_DTYPES = {"F32": torch.float32, "I64": torch.int64}


def load_safetensors(path):
    """The tensors of a safetensors file (8-byte little-endian header length, JSON header, raw
    little-endian data), without the safetensors package."""
    with open(path, "rb") as f:
        blob = f.read()
    (header_len,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_len])
    data = blob[8 + header_len:]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        dtype = SAFETENSORS_DTYPES[entry["dtype"]]
        values = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype)
        tensors[name] = values.reshape(entry["shape"])
    return tensors


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--weights", required=True, help="init.safetensors from sine --save-weights")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--size", type=int, default=0,
                   help="sine grid, as minamp's run (0: 512 on cuda, 64 on cpu)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = p.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.size == 0:
        args.size = 512 if args.device == "cuda" else 64
    return args


def main():
    args = parse_args()
    w = models.sine(args.device, 0, args.size)
    w.model.load_state_dict(load_safetensors(args.weights), strict=True)
    opt = torch.optim.Adam(w.model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(args.device)
    print(f"pytorch {torch.__version__} on {args.device}: sine {args.size}x{args.size} from "
          f"{args.weights}, autocast fp16 + GradScaler (init scale {scaler.get_scale():g})")
    print("step,loss,scale,skipped,nonfinite_grads")
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=torch.float16):
            loss = w.loss(w.model(w.inputs[0]), w.targets[0])
        scaler.scale(loss).backward()
        nonfinite = [name for name, p in w.model.named_parameters()
                     if not torch.isfinite(p.grad).all()]
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped = int(scaler.get_scale() < scale)
        print(f"{step},{loss.item():.6g},{scale:g},{skipped},{' '.join(nonfinite) or '-'}",
              flush=True)


if __name__ == "__main__":
    main()
