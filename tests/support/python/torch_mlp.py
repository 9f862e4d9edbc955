#!/usr/bin/env python3
"""tests/support/python/torch_mlp.py: the PyTorch reference MLP, for dptrain's GPU benchmark (scripts/bench/gpu_bench.sh).

The workload of configs/fmnist_mlp.toml, one process: MLP 784-512-512-10 with ReLU, cross-entropy, SGD with
momentum 0.9 and lr 0.05 on a per-step cosine schedule, Fashion-MNIST read from the IDX .gz files and
normalised as dptrain does, (x/255 - 0.2860)/0.3530, float32.

Per epoch: a random permutation of the training set; each step takes the next batch from a pinned CPU tensor
and copies it to the device with non_blocking=True (dptrain also moves every batch from the host), then
forward, loss, backward, optimizer step. The permuted copy is gathered before the epoch's clock starts: that
is the work dptrain's loader thread does ahead of the steps (data.prefetch), off the critical path.

Prints one line per epoch, "epoch E samples/s X loss L test_acc A time Ts", timed with the device
synchronised at both ends, evaluation excluded. The first epoch includes warm-up (CUDA context, cuBLAS
heuristics, the caching allocator): report the last.

  python3 tests/support/python/torch_mlp.py --data .gpu-bundle/data --batch-size 64 --epochs 2 --device cuda
"""
import argparse
import gzip
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

MEAN, STD = 0.2860, 0.3530  # the model (mlp) and the data (load) serve torch_ddp_mlp.py too


def read_idx(path):
    """An IDX file of unsigned bytes (.gz) as a uint8 tensor of its shape."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    (magic,) = struct.unpack(">I", raw[:4])
    if magic >> 8 != 0x08:  # 0x0008nn: unsigned bytes, nn dimensions
        raise ValueError(f"{path}: not an IDX file of unsigned bytes (magic {magic:#010x})")
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, raw[4 : 4 + 4 * ndim])
    body = raw[4 + 4 * ndim :]
    if len(body) != math.prod(dims):
        raise ValueError(f"{path}: {len(body)} bytes of data for shape {dims}")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(dims)


def load(data_dir, train):
    prefix = "train" if train else "t10k"
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    x = (images.reshape(images.shape[0], -1).float() / 255.0 - MEAN) / STD
    return x.contiguous(), labels.long()


def mlp(hidden, n_in=784, n_out=10):
    layers, width = [], n_in
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, n_out))
    return nn.Sequential(*layers)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="folder of the IDX .gz files")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", default="512,512", help="hidden widths, comma-separated")
    p.add_argument("--eval-batch-size", type=int, default=1024)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: no limit; for tests)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for --device cpu (0: PyTorch's default)")
    args = p.parse_args()

    # dptrain's cuBLAS GEMMs run in strict FP32; PyTorch may use TF32 for float32 matmuls on Ampere and newer
    # when allowed, which would be faster and less precise. Not allowed here: both do the same arithmetic.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_mlp: --device cuda but torch.cuda.is_available() is False")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(args.seed)

    x_train, y_train = load(args.data, True)
    x_test, y_test = load(args.data, False)
    n, batch = x_train.shape[0], args.batch_size
    # The epoch's shuffled copy, pinned so that the per-step host-to-device copies are asynchronous.
    xs = torch.empty(x_train.shape, dtype=x_train.dtype, pin_memory=cuda)
    ys = torch.empty(y_train.shape, dtype=y_train.dtype, pin_memory=cuda)
    x_test, y_test = x_test.to(dev), y_test.to(dev)

    model = mlp([int(h) for h in args.hidden.split(",") if h]).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    steps_per_epoch = (n + batch - 1) // batch  # the last, partial batch included (dptrain: drop_last = false)
    total_steps = steps_per_epoch * args.epochs
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    gen = torch.Generator().manual_seed(args.seed)

    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    print(f"# torch {torch.__version__} (CUDA {torch.version.cuda}) on {name}: batch {batch}, {args.epochs} epochs, "
          f"{steps_per_epoch} steps per epoch, tf32 {torch.backends.cuda.matmul.allow_tf32}", flush=True)

    step = 0
    for epoch in range(1, args.epochs + 1):
        if step >= total_steps:
            break
        perm = torch.randperm(n, generator=gen)
        torch.index_select(x_train, 0, perm, out=xs)
        torch.index_select(y_train, 0, perm, out=ys)
        if cuda and not (xs.is_pinned() and ys.is_pinned()):  # out= keeps the storage; never seen otherwise
            xs, ys = xs.pin_memory(), ys.pin_memory()
        model.train()
        loss_sum = torch.zeros((), device=dev)
        seen = steps = 0
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            if step >= total_steps:
                break
            xb = xs[i : i + batch].to(dev, non_blocking=True)
            yb = ys[i : i + batch].to(dev, non_blocking=True)
            lr = 0.5 * args.lr * (1.0 + math.cos(math.pi * step / total_steps))  # cosine to 0, per step
            for group in opt.param_groups:
                group["lr"] = lr
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum.add_(loss.detach(), alpha=xb.shape[0])  # on the device: no synchronisation per step
            seen += xb.shape[0]
            steps += 1
            step += 1
        if cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0

        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, x_test.shape[0], args.eval_batch_size):
                out = model(x_test[i : i + args.eval_batch_size])
                correct += (out.argmax(1) == y_test[i : i + args.eval_batch_size]).sum().item()
        print(f"epoch {epoch} samples/s {seen / elapsed:.0f} loss {loss_sum.item() / seen:.4f} "
              f"test_acc {correct / x_test.shape[0]:.4f} time {elapsed:.2f}s steps {steps}",
              flush=True)


if __name__ == "__main__":
    main()
