"""torchvision's ResNet outputs for minamp's parity test (tests/cpu/test_resnet.cpp).

Every weight, buffer and input value comes from a formula that the C++ test implements too, so
the fixture is a few kilobytes instead of a 100 MB weight file: for the t-th entry of the
state_dict (in torchvision's order, in PyTorch's layout) and its i-th value,

    x = lowbias32(i * 2654435761 + (t + 1) * 40503)   (uint32 arithmetic, wrapping)
    u = (x >> 8) * 2^-24                               (uniform in [0, 1), exact in float32)
    v = 2 u - 1                                        (exact)

and the value is, in float32 with one rounding: conv weights v * sqrt(6 / fan_in) (fan_in =
Cin kh kw), fc.weight v * sqrt(1 / in_features), BatchNorm weights and running variances u + 0.5,
every bias and running mean v * 0.1f, num_batches_tracked 0. The input image [N, 3, H, W] is v
for t = the number of state_dict entries. The script writes the state_dict's names and shapes,
a checksum of the generated values and the eval-mode logits of each architecture to
resnet_expected.json.

    bench/.venv/bin/python tests/parity/resnet_parity.py   # torch + torchvision, CPU is enough
"""
import json
import os

import numpy as np
import torch
import torchvision

ARCHS = ["resnet18", "resnet34", "resnet50"]
NUM_CLASSES = 10
IMAGE = [2, 3, 64, 64]


def lowbias32(x):
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def uniform(t, n):
    i = np.arange(n, dtype=np.uint32)
    x = lowbias32(i * np.uint32(2654435761) + np.uint32(((t + 1) * 40503) & 0xFFFFFFFF))
    return (x >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)


def generated(t, name, shape):
    n = int(np.prod(shape)) if shape else 1
    u = uniform(t, n)
    v = np.float32(2) * u - np.float32(1)
    if name.endswith("num_batches_tracked"):
        return np.zeros(shape, dtype=np.int64)
    if len(shape) == 4:
        fan_in = shape[1] * shape[2] * shape[3]
        values = v * np.sqrt(np.float32(6) / np.float32(fan_in))
    elif len(shape) == 2:
        values = v * np.sqrt(np.float32(1) / np.float32(shape[1]))
    elif name.endswith("running_var") or name.endswith("weight"):
        values = u + np.float32(0.5)
    else:  # biases and running means
        values = v * np.float32(0.1)
    return values.astype(np.float32).reshape(shape)


def compact_json(out):
    """The fixture as JSON with one line per state_dict entry (readable diffs, a small file)."""
    models = []
    for arch, m in out["models"].items():
        entries = ",\n".join(json.dumps(e, separators=(",", ":")) for e in m["state_dict"])
        models.append(f'{json.dumps(arch)}: {{"checksum": {json.dumps(m["checksum"])},\n'
                      f'"logits": {json.dumps(m["logits"])},\n"state_dict": [\n{entries}]}}')
    head = {k: v for k, v in out.items() if k != "models"}
    return json.dumps(head)[:-1] + ', "models": {\n' + ",\n".join(models) + "}}\n"


def main():
    torch.set_num_threads(1)
    out = {"num_classes": NUM_CLASSES, "image": IMAGE, "torch": torch.__version__,
           "torchvision": torchvision.__version__, "models": {}}
    for arch in ARCHS:
        model = getattr(torchvision.models, arch)(weights=None, num_classes=NUM_CLASSES).eval()
        entries, state, checksum = [], {}, 0.0
        for t, (name, tensor) in enumerate(model.state_dict().items()):
            shape = list(tensor.shape)
            values = generated(t, name, shape)
            state[name] = torch.from_numpy(values)
            entries.append([name, shape])
            if values.dtype == np.float32:
                checksum += float(np.sum(values.astype(np.float64)))
        model.load_state_dict(state, strict=True)
        image = generated(len(entries), "input", IMAGE)
        with torch.no_grad():
            logits = model(torch.from_numpy(image))
        out["models"][arch] = {
            "state_dict": entries,
            "checksum": checksum,
            "logits": [float(v) for v in logits.flatten()],
        }
        print(f"{arch}: {len(entries)} entries, logits max |.| {logits.abs().max():.4g}")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resnet_expected.json")
    with open(path, "w") as f:
        f.write(compact_json(out))
    print("wrote", path)


if __name__ == "__main__":
    main()
