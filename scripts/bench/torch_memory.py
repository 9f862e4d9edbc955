#!/usr/bin/env python3
"""scripts/bench/torch_memory.py: PyTorch's memory for dptrain's MLP, the reference of gpu-check's memory_vs_torch.

It builds exactly dptrain's MLP (models/model.cpp make_mlp): 784 inputs (a Fashion-MNIST image, flattened as
dptrain feeds it), Linear layers with biases and a ReLU after each hidden one, 10 outputs, softmax cross-entropy;
with dptrain's optimizer for configs/fmnist_mlp.toml, SGD with momentum 0.9 and weight decay 0 (one momentum buffer
per parameter, as dptrain's flat "momentum" slot), in fp32. It runs --steps training steps on random inputs of
batch --batch-size (per rank) and prints one JSON line:

  param_count, param_bytes       the model's parameters
  max_memory_allocated           torch.cuda.max_memory_allocated after the steps
  workspace_bytes                torch.cuda.memory_allocated before the model exists, after a warm-up matmul:
                                 cuBLAS's workspaces, which PyTorch's caching allocator holds and dptrain does not
                                 count among its tensors; max_memory_allocated - workspace_bytes is what compares
                                 with dptrain's peak tensor memory

With --device cpu it runs the same steps and prints param_count and param_bytes only (for a test on a CPU).

  python3 scripts/bench/torch_memory.py --hidden 8192,8192 --batch-size 64
"""
import argparse
import json
import sys

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as e:
    sys.exit(f"torch_memory.py: {sys.executable} cannot import torch ({e}): run it with the Python that has "
             "PyTorch (gpu-check.sh: $PYTHON; here: /usr/bin/python3 after scripts/setup.sh --bench)")


class Mlp(nn.Module):
    """dptrain's MLP, with its names: layers.0.weight, layers.0.bias, layers.2.weight, ..."""

    def __init__(self, hidden, n_in=784, n_out=10, device=None):
        super().__init__()
        layers, width = [], n_in
        for h in hidden:
            layers += [nn.Linear(width, h, device=device), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, n_out, device=device))
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers(x)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", default="512,512", help="hidden widths, comma-separated (dptrain's model.hidden)")
    p.add_argument("--batch-size", type=int, default=64, help="per rank (dptrain's train.batch_size)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = p.parse_args()
    hidden = [int(h) for h in args.hidden.split(",") if h]
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)

    workspace = 0
    if cuda:
        # The cuBLAS handle and its workspaces (a plain product, a Linear's addmm, which may take cuBLASLt, and
        # their backward), made on the stream training uses; then only what the allocator keeps for them is left.
        a = torch.randn(256, 784, device=dev, requires_grad=True)
        w = torch.randn(512, 784, device=dev, requires_grad=True)
        b = torch.randn(512, device=dev, requires_grad=True)
        (F.linear(a, w, b).sum() + (a @ w.t()).sum()).backward()
        del a, w, b
        torch.cuda.synchronize()
        workspace = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()

    model = Mlp(hidden, device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.0)
    x = torch.randn(args.batch_size, 784, device=dev)
    y = torch.randint(0, 10, (args.batch_size,), device=dev)
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    n = sum(t.numel() for t in model.parameters())
    out = {"device": args.device, "hidden": hidden, "param_count": n,
           "param_bytes": sum(t.numel() * t.element_size() for t in model.parameters())}
    if cuda:
        torch.cuda.synchronize()
        out.update(batch_size=args.batch_size, steps=args.steps, max_memory_allocated=torch.cuda.max_memory_allocated(),
                   workspace_bytes=workspace, torch=torch.__version__, gpu=torch.cuda.get_device_name(dev))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
