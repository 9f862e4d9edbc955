#!/usr/bin/env python3
"""tests/support/python/torch_ddp_mlp.py: PyTorch DDP reference for dptrain's CPU training benchmark (scripts/bench/train_bench.sh).

The workload of configs/fmnist_mlp.toml on CPU, one process per rank, ONE thread per rank: MLP 784-512-512-10
with ReLU, cross-entropy, SGD lr 0.05 momentum 0.9 (constant: the schedule does not matter for speed),
batch 64 PER RANK, Fashion-MNIST read once from the IDX .gz files into a tensor, normalised as dptrain does,
(x/255 - 0.2860)/0.3530, float32. The model and the data are torch_mlp.py's (mlp, load): one MLP reference. DistributedDataParallel over gloo with its defaults
(bucket_cap_mb 25, gradients all-reduced in buckets while backward runs); a DistributedSampler (shuffle,
seed, padded shards as dptrain's drop_last = false) gives each rank 60000/N examples per epoch.

Batches (--loader):
  batched     (default) DataLoader(sampler=BatchSampler(DistributedSampler, 64), batch_size=None): each
              batch is one gather, dataset[list of 64 indices], as fast as slicing a pre-shuffled tensor
  per-sample  the textbook DataLoader(dataset, batch_size=64, sampler=DistributedSampler): 64 items
              collated per batch (slower: reported for reference, not the comparison)
num_workers=0 in both: the batches are made inline, on the step's critical path, and counted in the time.

Timed on every rank from a barrier to the end of the epoch loop (data + forward + backward with DDP's
bucketed allreduce + optimizer step), rank 0's clock reported. After the epoch, --compute-steps steps are
timed under ddp.no_sync() (no allreduce) on the same batches, on every rank at once (the two ranks share the
cores as in the epoch): that per-step compute time x the epoch's steps estimates the epoch's compute, and the
rest of the epoch is communication left exposed plus data and Python overhead.

Rank 0 prints one parseable line (extra fields after the first five, in key value pairs):
  torch_ddp world N samples/s X epoch_s Y steps S compute_ms_per_step C compute_s E other_s O loss L

Launch (both work with Debian's python3-torch 1.13):
  python3 -m torch.distributed.run --standalone --nproc_per_node 2 tests/support/python/torch_ddp_mlp.py
  python3 tests/support/python/torch_ddp_mlp.py --nproc 2      # spawns the ranks itself, free port on 127.0.0.1
"""
import argparse
import os
import socket
import sys
import time


def _threads_arg(argv):
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "1"


# One thread per rank, also for OpenBLAS's own pool, which reads these when it loads (with torch, in run):
# set before the first import of torch. An explicit setting in the environment wins.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, _threads_arg(sys.argv[1:]))


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import BatchSampler, DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    from torch_mlp import load, mlp  # beside this file: the same MLP and data as the single-process reference

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment
    rank, world = dist.get_rank(), dist.get_world_size()
    lead = rank == 0
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)

    x, y = load(args.data, True)
    ds = TensorDataset(x, y)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=False)
    sampler.set_epoch(0)
    if args.loader == "batched":
        loader = DataLoader(ds, sampler=BatchSampler(sampler, args.batch_size, drop_last=False), batch_size=None,
                            num_workers=0)
    else:
        loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, num_workers=0, drop_last=False)

    model = DDP(mlp([int(v) for v in args.hidden.split(",") if v]), bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    if lead:
        print(f"# torch {torch.__version__}, gloo, world {world}, threads {torch.get_num_threads()} per rank, "
              f"batch {args.batch_size} per rank, {len(sampler)} examples per rank, loader {args.loader}, "
              f"bucket_cap_mb {args.bucket_cap_mb}", flush=True)

    model.train()
    loss_sum = torch.zeros(())
    seen = steps = 0
    dist.barrier()
    t0 = time.perf_counter()
    for xb, yb in loader:
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradients in buckets as they become ready
        opt.step()
        loss_sum += loss.detach() * xb.shape[0]
        seen += xb.shape[0]
        steps += 1
    epoch_s = time.perf_counter() - t0

    stats = torch.tensor([loss_sum.item(), float(seen)], dtype=torch.float64)
    dist.all_reduce(stats)
    global_seen = stats[1].item()

    # Compute only: forward + backward + step without the allreduce, on batches made ahead of time.
    per_step = 0.0
    if args.compute_steps > 0:
        batches = []
        for xb, yb in loader:
            batches.append((xb, yb))
            if len(batches) == 8:
                break
        for i in range(3):  # warm
            xb, yb = batches[i % len(batches)]
            with model.no_sync():
                F.cross_entropy(model(xb), yb).backward()
        dist.barrier()
        c0 = time.perf_counter()
        for i in range(args.compute_steps):
            xb, yb = batches[i % len(batches)]
            opt.zero_grad(set_to_none=True)
            with model.no_sync():
                F.cross_entropy(model(xb), yb).backward()
            opt.step()
        per_step = (time.perf_counter() - c0) / args.compute_steps
        dist.barrier()

    if lead:
        compute_s = per_step * steps
        print(f"torch_ddp world {world} samples/s {global_seen / epoch_s:.0f} epoch_s {epoch_s:.3f} steps {steps} "
              f"compute_ms_per_step {per_step * 1e3:.3f} compute_s {compute_s:.3f} "
              f"other_s {max(epoch_s - compute_s, 0.0):.3f} loss {stats[0].item() / global_seen:.4f}", flush=True)
    dist.destroy_process_group()


def spawned(local_rank, args, port):
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(args.nproc),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    run(args)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="folder of the IDX .gz files")
    p.add_argument("--batch-size", type=int, default=64, help="examples per step PER RANK")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", default="512,512", help="hidden widths, comma-separated")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's gradient bucket size")
    p.add_argument("--loader", choices=["batched", "per-sample"], default="batched")
    p.add_argument("--compute-steps", type=int, default=100, help="steps timed without allreduce (0: skip)")
    p.add_argument("--nproc", type=int, default=0,
                   help="without a launcher (no RANK in the environment): spawn this many ranks here")
    args = p.parse_args()

    if "RANK" in os.environ:
        run(args)
    elif args.nproc > 0:
        import torch.multiprocessing as mp

        mp.spawn(spawned, args=(args, free_port()), nprocs=args.nproc, join=True)
    else:
        sys.exit("torch_ddp_mlp: start it with python3 -m torch.distributed.run --nproc_per_node N, or pass --nproc N")


if __name__ == "__main__":
    main()
