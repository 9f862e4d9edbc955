"""tests/integration/lib/torch_resnet.py: the PyTorch side of the ResNet parity tests (Debian's python3-torch
and python3-torchvision, CPU, reference only). Tensors travel as safetensors (ckpt.py reads and writes them
with numpy alone).
  torch_resnet.py make VARIANT DIR   a torchvision model with a fixed seed: DIR/weights.safetensors (its
                                     state_dict), DIR/input.safetensors (x, y), DIR/expected.safetensors
                                     (training-mode logits, loss, grad.<param>, buffers after the forward,
                                     eval_logits), and DIR/overrides (dptrain's model.* keys for it)
  torch_resnet.py check VARIANT DIR  compares DIR/out/out.safetensors (dpt-model-io) with the expectation, and
                                     loads DIR/out/state.safetensors into a fresh torchvision model with
                                     load_state_dict(strict=True): its eval logits must equal dptrain's
  torch_resnet.py weights ARCH CLASSES FILE   writes torchvision's ARCH(num_classes=CLASSES) state_dict
                                     (more ARCH CLASSES FILE triples may follow: one file each)
  torch_resnet.py load ARCH CLASSES FILE      loads FILE (e.g. a dptrain checkpoint's model.safetensors) into
                                     ARCH(num_classes=CLASSES) with strict=True and prints its tensor count
Tolerances (fp32, different summation orders): logits and eval logits within 1e-4 of their largest
magnitude; each gradient within 2e-3 of its own largest magnitude; buffers within 1e-5.
"""
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torchvision
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

sys.path.insert(0, os.path.dirname(__file__))
import ckpt  # noqa: E402
from parity import bf16_like_autocast, close, rel_err  # noqa: E402

torch.set_num_threads(1)


def small_stem(model, in_channels):
    """torchvision's ResNet with dptrain's model.stem = small: conv1 3x3 stride 1, no max pool."""
    model.conv1 = nn.Conv2d(in_channels, model.conv1.out_channels, 3, 1, 1, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.maxpool = nn.Identity()
    return model


# name -> (torch model builder, input shape, classes, dptrain overrides). Inputs are large enough that no
# BatchNorm channel sees (nearly) constant values: at 12x12 the small-stem net's layer4 is 2x2, some channels
# there are constant over the batch, and BatchNorm then normalises rounding noise, flipping ReLU masks between
# any two implementations (gradients then differ by 10% while finite differences agree with both).
VARIANTS = {
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=10), (3, 3, 48, 40), 10,
                 ["model.name=resnet", "model.depth=18", "model.num_classes=10"]),
    "small": (lambda: small_stem(ResNet(BasicBlock, [1, 1, 1, 1], num_classes=7), 1), (4, 1, 28, 28), 7,
              ["model.name=resnet", "model.blocks=[1,1,1,1]", "model.stem=small", "model.num_classes=7"]),
    "bottleneck": (lambda: ResNet(Bottleneck, [1, 2, 1, 1], num_classes=5), (2, 3, 40, 40), 5,
                   ["model.name=resnet", "model.blocks=[1,2,1,1]", "model.block=bottleneck", "model.num_classes=5"]),
}


# bf16 variants: the fp32 variant's model and batch, dptrain with train.precision=bf16, torch under
# torch.autocast("cpu", torch.bfloat16). Neither equals fp32; both must be about as far from it.
BF16 = {"small_bf16": "small", "resnet18_bf16": "resnet18"}


def state_arrays(model):
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def make(variant, d):
    bf16 = variant in BF16
    build, shape, classes, overrides = VARIANTS[BF16.get(variant, variant)]
    if bf16:
        overrides = overrides + ["train.precision=bf16"]
    torch.manual_seed(1234)
    model = build()
    # Non-trivial BatchNorm affine parameters and running statistics, so their handling is checked too.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 2.0)
                m.num_batches_tracked.fill_(3)
    os.makedirs(d, exist_ok=True)
    ckpt.save(os.path.join(d, "weights.safetensors"), state_arrays(model))
    x = torch.randn(*shape)
    y = torch.arange(shape[0]) % classes
    ckpt.save(os.path.join(d, "input.safetensors"), {"x": x.numpy(), "y": y.numpy()})
    model.train()
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    out = {"logits": logits.detach().numpy(), "loss": np.array(loss.item())}
    for name, p in model.named_parameters():
        out["grad." + name] = p.grad.numpy()
    for name, b in model.named_buffers():
        out[name] = b.numpy()
    model.eval()
    with torch.no_grad():
        out["eval_logits"] = model(x).numpy()
    ckpt.save(os.path.join(d, "expected.safetensors"), out)
    if bf16:  # the same step under autocast, from the same weights
        torch.manual_seed(1234)
        model = build()
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in ckpt.load(os.path.join(d, "weights.safetensors")).items()})
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = nn.functional.cross_entropy(logits.float(), y)
        loss.backward()
        out = {"logits": logits.float().detach().numpy()}
        for name, p in model.named_parameters():
            out["grad." + name] = p.grad.float().numpy()
        ckpt.save(os.path.join(d, "torch_bf16.safetensors"), out)
    with open(os.path.join(d, "overrides"), "w") as f:
        f.write(" ".join(overrides) + "\n")


def check_bf16(variant, d):
    """dptrain's bf16 error (against torch fp32) must be within 0.2x to 3x torch autocast's, per tensor, and
    the logits within 5% of torch bf16's."""
    ref = ckpt.load(os.path.join(d, "expected.safetensors"))
    tb = ckpt.load(os.path.join(d, "torch_bf16.safetensors"))
    got = ckpt.load(os.path.join(d, "out", "out.safetensors"))
    worst, _ = bf16_like_autocast(ref, tb, got)
    direct = rel_err(got["logits"], tb["logits"])
    if direct > 0.05:
        sys.exit(f"FAIL logits: dptrain bf16 vs torch autocast bf16 {direct:.3g}")
    print(f"{variant}: dptrain bf16's distance from fp32 is at most {worst:.2f}x torch autocast's over "
          f"{len(tb)} tensors; logits within {direct:.2g} of torch bf16's")


def check(variant, d):
    if variant in BF16:
        return check_bf16(variant, d)
    build, _, _, _ = VARIANTS[variant]
    want = ckpt.load(os.path.join(d, "expected.safetensors"))
    got = ckpt.load(os.path.join(d, "out", "out.safetensors"))
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing or extra:
        sys.exit(f"FAIL tensor names differ: missing {missing[:5]}, extra {extra[:5]}")
    worst = {"logits": 0.0, "grad": 0.0, "buffer": 0.0}
    for name in want:
        if name == "loss":
            if abs(float(got[name]) - float(want[name])) > 1e-5 * max(1.0, abs(float(want[name]))):
                sys.exit(f"FAIL loss {float(got[name])} vs {float(want[name])}")
        elif name in ("logits", "eval_logits"):
            worst["logits"] = max(worst["logits"], close(name, got[name], want[name], 1e-4))
        elif name.startswith("grad."):
            worst["grad"] = max(worst["grad"], close(name, got[name], want[name], 2e-3))
        elif name.endswith("num_batches_tracked"):
            if int(got[name]) != int(want[name]):
                sys.exit(f"FAIL {name}: {int(got[name])} vs {int(want[name])}")
        else:
            worst["buffer"] = max(worst["buffer"], close(name, got[name], want[name], 1e-5))
    # dptrain's state -> torchvision, strictly: the same eval logits.
    model = build()
    state = {k: torch.from_numpy(np.array(v)) for k, v in ckpt.load(os.path.join(d, "out", "state.safetensors")).items()}
    model.load_state_dict(state, strict=True)
    model.eval()
    x = torch.from_numpy(np.array(ckpt.load(os.path.join(d, "input.safetensors"))["x"]))
    with torch.no_grad():
        interop = model(x).numpy()
    err = close("interop eval_logits", interop, got["eval_logits"], 1e-4)
    print(f"{variant}: {len(want)} tensors match; worst relative error: logits {worst['logits']:.2g}, "
          f"gradients {worst['grad']:.2g}, buffers {worst['buffer']:.2g}; state loads into torchvision "
          f"(strict), eval logits within {err:.2g}")


def main():
    cmd = sys.argv[1]
    if cmd == "make":
        make(sys.argv[2], sys.argv[3])
    elif cmd == "check":
        check(sys.argv[2], sys.argv[3])
    elif cmd == "weights":  # ARCH CLASSES FILE, repeated: one Python start for several files
        for i in range(2, len(sys.argv) - 2, 3):
            torch.manual_seed(7)
            model = getattr(torchvision.models, sys.argv[i])(num_classes=int(sys.argv[i + 1]))
            ckpt.save(sys.argv[i + 2], state_arrays(model))
    elif cmd == "load":
        model = getattr(torchvision.models, sys.argv[2])(num_classes=int(sys.argv[3]))
        state = {k: torch.from_numpy(np.array(v)) for k, v in ckpt.load(sys.argv[4]).items()}
        model.load_state_dict(state, strict=True)
        print(f"loaded {len(state)} tensors into torchvision.models.{sys.argv[2]}(num_classes={sys.argv[3]}) strictly")
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
