#!/usr/bin/env python3
"""torch_loader.py: the reference for dpt-loader-bench --config on an image folder: torchvision's ImageFolder with the
training transform dptrain's data.augment = "random_resized_crop" mirrors (RandomResizedCrop(size) +
RandomHorizontalFlip + ToTensor + Normalize), read through a DataLoader (shuffled, the batch size given, num_workers
worker processes kept across epochs), consuming nothing else. Prints a line per epoch and
"examples/s (median of epochs 2 on): X".

  python3 torch_loader.py --dir DIR [--batch 32] [--workers 1] [--epochs 3] [--max-batches 0] [--size 224]
"""
import argparse
import statistics
import time

import torch
import torchvision
from torchvision import transforms


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="the image folder (DIR/train/<class>/*.jpg)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=1, help="DataLoader num_workers (0: the main process decodes)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max-batches", type=int, default=0, help="at most this many batches an epoch (0: all)")
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tf = transforms.Compose([
        transforms.RandomResizedCrop(args.size),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    ds = torchvision.datasets.ImageFolder(f"{args.dir}/train", transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                                         persistent_workers=args.workers > 0)
    print(f"# torch_loader.py: torch {torch.__version__}, torchvision {torchvision.__version__}, {len(ds)} images, "
          f"batch {args.batch}, {args.workers} worker(s), {args.epochs} epochs")
    rates = []
    for e in range(args.epochs):
        n = 0
        start = time.perf_counter()
        for i, (x, _) in enumerate(loader):
            n += x.shape[0]
            if args.max_batches and i + 1 >= args.max_batches:
                break
        seconds = time.perf_counter() - start
        rates.append(n / seconds)
        print(f"epoch {e + 1}: {n} examples in {seconds:.3f} s, {rates[-1]:.1f} examples/s", flush=True)
    if len(rates) > 1:
        rates = rates[1:]
    print(f"\nexamples/s (median of epochs {'2 on' if args.epochs > 1 else '1'}): {statistics.median(rates):.1f}")


if __name__ == "__main__":
    main()
