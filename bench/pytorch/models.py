"""The benchmark models of bench/train.cpp in PyTorch, with the same shapes, batches, losses and
optimizers: mlp (the seed config), sine (the ROCm blog's conv net), classify (the benchmark's own
small CNN), resnet18 and resnet50 (torchvision's) and resnet50-frozen (its classifier alone). Conv
nets run NCHW modules in channels_last memory format, which is minamp's NHWC layout, unless built with
channels_last=False (PyTorch's default NCHW layout)."""

import math

import torch
from torch import nn


class Workload:
    """A model with its batches on the device, its loss and optimizer (make_optimizer(params,
    **impl) passes impl, e.g. fused=True, on to the torch.optim constructor)."""

    def __init__(self, name, model, inputs, targets, loss, make_optimizer, description, optimizer):
        self.name = name
        self.model = model
        self.inputs = inputs
        self.targets = targets
        self.loss = loss
        self.make_optimizer = make_optimizer
        self.description = description
        self.optimizer = optimizer

    def data_bytes(self):
        tensors = self.inputs + self.targets
        return sum(t.numel() * t.element_size() for t in tensors)


def mlp(device, seed):
    """Linear(8,16)-ReLU-Linear(16,16)-ReLU-Linear(16,1), MSE, SGD lr 1e-3, 50 batches of 512."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)
    ).to(device)
    gen = torch.Generator().manual_seed(seed + 1)
    inputs = [torch.randn(512, 8, generator=gen).to(device) for _ in range(50)]
    targets = [torch.randn(512, 1, generator=gen).to(device) for _ in range(50)]
    return Workload(
        "mlp", model, inputs, targets, nn.functional.mse_loss,
        lambda params, **impl: torch.optim.SGD(params, lr=1e-3, **impl),
        "Linear(8,16)-ReLU-Linear(16,16)-ReLU-Linear(16,1), MSE, batch 512", "SGD lr 1e-3",
    )


def sine_data(size):
    """The [1, 2, S, S] coordinate grid and the quantized sine target [1, 1, S, S], computed as
    examples/sine_data.h does: cos(2 pi 4 x) + cos(2 pi 2 y) in 4 equal-width levels."""
    step = 1.0 / (size - 1) if size > 1 else 0.0
    axis = torch.arange(size, dtype=torch.float64) * step
    y, x = torch.meshgrid(axis, axis, indexing="ij")
    x, y = x.float().double(), y.float().double()
    wave = torch.cos(x * 4 * 2 * math.pi) + torch.cos(y * 2 * 2 * math.pi)
    lo, hi = wave.min(), wave.max()
    width = (hi - lo) / 4
    bins = sum((wave >= lo + k * width).long() for k in (1, 2, 3))
    grid = torch.stack([x, y]).float().unsqueeze(0)
    return grid, (bins.double() / 3.0).float().view(1, 1, size, size)


def memory_format(channels_last):
    return torch.channels_last if channels_last else torch.contiguous_format


def sine(device, seed, size, channels_last=True):
    """1x1 Conv(2,256)+BN+ReLU, 2x[Conv(256,256)+BN+ReLU], Conv(256,1); MSE; Adam lr 1e-3."""
    torch.manual_seed(seed)
    hidden, layers, channels = 256, [], 2
    for _ in range(3):
        layers += [nn.Conv2d(channels, hidden, 1), nn.BatchNorm2d(hidden), nn.ReLU()]
        channels = hidden
    layers.append(nn.Conv2d(hidden, 1, 1))
    layout = memory_format(channels_last)
    model = nn.Sequential(*layers).to(device, memory_format=layout)
    grid, target = sine_data(size)
    return Workload(
        "sine", model, [grid.to(device, memory_format=layout)],
        [target.to(device, memory_format=layout)], nn.functional.mse_loss,
        lambda params, **impl: torch.optim.Adam(params, lr=1e-3, **impl),
        f"1x1 Conv(2,256)+BN+ReLU, 2x[Conv(256,256)+BN+ReLU], Conv(256,1), MSE, grid {size}x{size}",
        "Adam lr 1e-3",
    )


def classify(device, seed, channels_last=True):
    """The benchmark's CNN on 28x28 grey: 4 x [Conv3x3 (no bias, padding 1)+BN+ReLU] with
    channels 1-32-32-64-64 and stride 2 in the 2nd and 4th, global average pool, Linear(64,10);
    cross-entropy; SGD lr 0.01 momentum 0.9; 4 random batches of 128."""
    torch.manual_seed(seed)
    channels, layers = [1, 32, 32, 64, 64], []
    for i in range(4):
        stride = 2 if i % 2 == 1 else 1
        layers += [
            nn.Conv2d(channels[i], channels[i + 1], 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(channels[i + 1]),
            nn.ReLU(),
        ]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    layout = memory_format(channels_last)
    model = nn.Sequential(*layers).to(device, memory_format=layout)
    gen = torch.Generator().manual_seed(seed + 1)
    inputs = [
        torch.randn(128, 1, 28, 28, generator=gen).to(device, memory_format=layout)
        for _ in range(4)
    ]
    targets = [torch.randint(0, 10, (128,), generator=gen).to(device) for _ in range(4)]
    return Workload(
        "classify", model, inputs, targets, nn.functional.cross_entropy,
        lambda params, **impl: torch.optim.SGD(params, lr=0.01, momentum=0.9, **impl),
        "Conv3x3(1,32)+BN+ReLU, Conv3x3(32,32,s2)+BN+ReLU, Conv3x3(32,64)+BN+ReLU, "
        "Conv3x3(64,64,s2)+BN+ReLU, GAP, Linear(64,10), CE, batch 128, 28x28x1 (benchmark's "
        "own definition, random data)",
        "SGD lr 0.01 momentum 0.9",
    )


def resnet(arch, device, seed, size, batch, frozen, channels_last=True):
    """torchvision's resnet18 or resnet50 (arch) with 256 classes, cross-entropy, Adam lr 1e-4, 2 random batches of
    `batch` images at size x size; with `frozen`, every parameter but fc's has requires_grad
    False (autograd then records nothing for the backbone)."""
    import torchvision  # only these models need it

    torch.manual_seed(seed)
    model = getattr(torchvision.models, arch)(weights=None, num_classes=256)
    if frozen:
        model.requires_grad_(False)
        model.fc.requires_grad_(True)
    layout = memory_format(channels_last)
    model = model.to(device, memory_format=layout)
    gen = torch.Generator().manual_seed(seed + 1)
    inputs = [
        torch.randn(batch, 3, size, size, generator=gen).to(device, memory_format=layout)
        for _ in range(2)
    ]
    targets = [torch.randint(0, 256, (batch,), generator=gen).to(device) for _ in range(2)]
    return Workload(
        f"{arch}-frozen" if frozen else arch, model, inputs, targets,
        nn.functional.cross_entropy,
        lambda params, **impl: torch.optim.Adam([p for p in params if p.requires_grad], lr=1e-4,
                                                **impl),
        f"torchvision {arch}, 256 classes, CE, "
        f"{'backbone frozen (fc trains), ' if frozen else ''}batch {batch}, {size}x{size}x3 "
        "(random data)",
        "Adam lr 1e-4",
    )


MODELS = ("mlp", "sine", "classify", "resnet18", "resnet50", "resnet50-frozen")


def build(name, device, seed, size, channels_last=True, resnet_size=224, resnet_batch=64):
    """A workload; channels_last picks the conv nets' memory format (mlp has no convs)."""
    if name == "mlp":
        return mlp(device, seed)
    if name == "sine":
        return sine(device, seed, size, channels_last)
    if name == "classify":
        return classify(device, seed, channels_last)
    if name in ("resnet18", "resnet50", "resnet50-frozen"):
        arch, frozen = name.removesuffix("-frozen"), name.endswith("-frozen")
        return resnet(arch, device, seed, resnet_size, resnet_batch, frozen, channels_last)
    raise ValueError(f"unknown model '{name}' (expected {', '.join(MODELS)})")
