#!/usr/bin/env python3
"""tests/support/python/torch_optim.py: dptrain's optimizers, schedules and clipping against torch.optim.

The workload is full-batch: the first N Fashion-MNIST training examples (data.train_limit = N) are one step's global
batch (ranks x train.batch_size x train.accum_steps = N), so every optimizer step sees the same examples in
any order and a run of E epochs is E steps. torch.optim (SGD, AdamW), torch.optim.lr_scheduler (LinearLR's warm-up,
then CosineAnnealingLR or a constant, through SequentialLR) and torch.nn.utils.clip_grad_norm_ reproduce it from
the same initial weights; nanoGPT's parameter groups where train.weight_decay_params = matrices.

  torch_optim.py init INIT.safetensors HIDDEN            an MLP's initial weights (torch's initialisation, seed 0)
  torch_optim.py train INIT OUT.json KEY=VALUE...        train as dptrain would with those train.* keys; writes the
                                                         final weights beside OUT.json (OUT.safetensors) and, per
                                                         step, the learning rate and the gradient norm before clipping
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt  # noqa: E402
from torch_mlp import load, mlp  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"


def names(model):
    """dptrain's MLP names its nn.Sequential's linear layers as torch does: layers.0, layers.2, ..."""
    return {f"layers.{k}": v for k, v in model.state_dict().items()}


def init(path, hidden):
    torch.manual_seed(0)
    model = mlp([int(h) for h in hidden.split(",")])
    ckpt.save(path, {k: v.numpy() for k, v in names(model).items()})


def schedule(opt, cfg, total):
    """dptrain's lr_at as torch's schedulers: (s + 1) / W of the peak for the W warm-up steps, then the schedule."""
    w = int(cfg.get("train.warmup_steps", 0))
    kind = cfg.get("train.schedule", "cosine")
    if kind == "cosine":
        min_lr = float(cfg.get("train.min_lr", 0))
        main = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - w, eta_min=min_lr)
    elif kind == "constant":
        main = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    else:
        sys.exit(f"torch_optim.py: schedule {kind} is not reproduced here")
    if w <= 1:
        assert w == 0, "a warm-up of 1 step is LinearLR over 0 iterations: not reproduced here"
        return main
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0 / w, end_factor=1.0, total_iters=w - 1)
    return torch.optim.lr_scheduler.SequentialLR(opt, [warm, main], milestones=[w])


def optimizer(model, cfg):
    lr = float(cfg.get("train.lr", 0.05))
    wd = float(cfg.get("train.weight_decay", 0.0))
    params = list(model.parameters())
    if cfg.get("train.weight_decay_params", "auto") == "matrices":  # nanoGPT's configure_optimizers
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": wd},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    else:
        groups = [{"params": params, "weight_decay": wd}]
    if cfg.get("train.optimizer", "sgd") == "adamw":
        betas = (float(cfg.get("train.beta1", 0.9)), float(cfg.get("train.beta2", 0.999)))
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=float(cfg.get("train.eps", 1e-8)))
    return torch.optim.SGD(groups, lr=lr, momentum=float(cfg.get("train.momentum", 0.9)),
                           nesterov=cfg.get("train.nesterov", "false") == "true")


def train(init_path, out_json, cfg):
    torch.set_num_threads(1)
    hidden = [int(h) for h in cfg["model.hidden"].strip("[]").split(",")]
    model = mlp(hidden)
    w = ckpt.load(init_path)
    model.load_state_dict({k.replace("layers.", "", 1): torch.from_numpy(v.copy()) for k, v in w.items()})
    x, y = load(DATA, True)
    n = int(cfg["data.train_limit"])
    x, y = x[:n], y[:n]
    steps = int(cfg["train.epochs"])
    opt = optimizer(model, cfg)
    sched = schedule(opt, cfg, steps)
    clip = float(cfg.get("train.clip_grad_norm", 0))
    record = []
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
        else:
            norm = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())))
        record.append({"lr": opt.param_groups[0]["lr"], "grad_norm": norm})
        opt.step()
        sched.step()
    ckpt.save(out_json[: -len(".json")] + ".safetensors", {k: v.numpy() for k, v in names(model).items()})
    with open(out_json, "w") as f:
        json.dump(record, f)


def main():
    if sys.argv[1] == "init":
        init(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "train":
        cfg = dict(a.split("=", 1) for a in sys.argv[4:])
        train(sys.argv[2], sys.argv[3], cfg)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
