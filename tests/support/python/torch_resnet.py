#!/usr/bin/env python3
"""tests/support/python/torch_resnet.py: the PyTorch reference ResNet (torchvision's), for the benchmark and the tests.

Two entry points:
  - the benchmark (scripts/bench/resnet_bench.sh, scripts/gpu-check.sh): the twin of dpt-model-bench, options below;
  - the parity and interop tests (tests/integration/resnet_torch_parity.sh, imagefolder_finetune.sh): the
    subcommands `make`, `check`, `weights` and `load`, at the end of this text.

The same workload as dpt-model-bench: torchvision.models.resnetNN(num_classes=CLASSES), one random batch
[N, C, H, W] (standard normal) with random labels made once on the device, then --warmup untimed and --steps
timed training steps: forward, cross-entropy, backward, SGD (lr 0.05, momentum 0.9, as dptrain's defaults).
Prints the same fixed-width row as dpt-model-bench (time per step, images/s, the mean loss of the timed
steps) and, with --json FILE, the same JSON.

  step mode (default): one process on --device (auto: cuda when available). On a GPU: PyTorch eager as people
      run it fast: channels_last memory format and torch.backends.cudnn.benchmark = True; --precision bf16 runs
      forward and loss under torch.autocast(device_type="cuda", dtype=torch.bfloat16); timing with CUDA events
      around the timed steps. FP32 runs without TF32 unless --tf32 (dptrain's FP32 convolutions and GEMMs are
      strict FP32; PyTorch's cuDNN convolutions would use TF32 by default).
  ddp mode (--nproc N): N processes on the CPU (spawned here, rendezvous on a free port of 127.0.0.1), each
      wrapping the model in DistributedDataParallel over gloo (default 25 MB buckets, broadcast_buffers), each
      with its own random batch of --batch examples; the timed steps run between two barriers, and
      images/s = N * batch * steps / (the slowest rank's time).

CPU threads: --threads per process (default 1), set before torch loads, for OpenMP, OpenBLAS and MKL alike.
OpenBLAS: dptrain restarts itself with OPENBLAS_CORETYPE set when OpenBLAS misdetects the CPU (this VM's
AVX-512 EPYC is taken for a Prescott); resnet_bench.sh passes the same OPENBLAS_CORETYPE to this script, which
prints it. (PyTorch's CPU convolutions run in oneDNN, which detects the CPU itself; OpenBLAS serves the GEMMs.)

  python3 tests/support/python/torch_resnet.py --model resnet18 --batch 256 --shape 3,32,32 --classes 10 --precision bf16
  python3 tests/support/python/torch_resnet.py --model resnet18 --batch 256 --shape 3,32,32 --device cpu --nproc 2

Parity (Debian's python3-torch and python3-torchvision, CPU; numpy, ckpt.py and parity.py beside this file).
Tensors travel as safetensors (ckpt.py reads and writes them with numpy alone).
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
magnitude; each gradient within 2e-3 of its own largest magnitude, once the ReLU masks that flipped where an
input lies within rounding of 0 are taken off (NEAR_TIE); buffers within 1e-5.
"""
import argparse
import copy
import json
import os
import socket
import sys
import time


import threads  # noqa: E402,F401  (sets the thread counts; before torch)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

COLUMNS = ("program", "model", "shape", "batch", "precision", "device", "ranks", "time/step", "images/s", "loss")


def print_header():
    """The table head of dpt-model-bench (bench/model_bench.cpp), column for column."""
    print("#{:>11}  {:>10}  {:>10}  {:>5}  {:>9}  {:>6}  {:>5}  {:>9}  {:>9}  {:>7}".format(*COLUMNS))
    print("#{:>11}  {:>10}  {:>10}  {:>5}  {:>9}  {:>6}  {:>5}  {:>9}  {:>9}  {:>7}".format(
        "", "", "", "", "", "", "", "(ms)", "(1/s)", "(mean)"))


def print_row(r):
    print("{:>12}  {:>10}  {:>10}  {:>5}  {:>9}  {:>6}  {:>5}  {:>9.2f}  {:>9.1f}  {:>7.4f}".format(
        r["program"], r["model"], "x".join(str(d) for d in r["shape"]), r["batch"], r["precision"],
        r["device"].split(":")[0], r["ranks"], r["ms_per_step"], r["images_per_s"], r["loss"]), flush=True)


# ---- the model: torchvision's, or the same architecture written out where torchvision is not installed ----


def _conv3x3(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 3, stride, 1, bias=False)


class _BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1, self.bn1 = _conv3x3(cin, planes, stride), nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2, self.bn2 = _conv3x3(planes, planes), nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, planes, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = _conv3x3(planes, planes, stride), nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = nn.Conv2d(planes, planes * 4, 1, bias=False), nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class _ResNet(nn.Module):
    """torchvision.models.resnet.ResNet (v1.5: the stride in the 3x3 conv), its names and initialisation."""

    def __init__(self, block, layers, num_classes):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1, self.relu = nn.BatchNorm2d(64), nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], 2)
        self.layer3 = self._make_layer(block, 256, layers[2], 2)
        self.layer4 = self._make_layer(block, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


_LAYERS = {"resnet18": (_BasicBlock, [2, 2, 2, 2]), "resnet34": (_BasicBlock, [3, 4, 6, 3]),
           "resnet50": (_Bottleneck, [3, 4, 6, 3])}


def make_model(name, num_classes):
    """(model, where it came from)."""
    try:
        import torchvision

        return getattr(torchvision.models, name)(num_classes=num_classes), f"torchvision {torchvision.__version__}"
    except ImportError:
        block, layers = _LAYERS[name]
        return _ResNet(block, layers, num_classes), "torchvision not installed: the same architecture, written out here"


# ---- one process's steps -------------------------------------------------------------------------------


def random_batch(args, device, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((args.batch, *args.shape), generator=g)
    y = torch.randint(0, args.classes, (args.batch,), generator=g)
    return x.to(device), y.to(device)


def setup_backends(args, cuda):
    torch.set_num_threads(args.threads)
    if cuda:
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = args.tf32
        torch.backends.cuda.matmul.allow_tf32 = args.tf32


def timed_steps(args, model, x, y, device, ddp=None):
    """Warm-up, then the timed steps. Returns (seconds, mean loss of the timed steps)."""
    cuda = device.type == "cuda"
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    loss_sum = torch.zeros((), device=device)

    def step():
        with autocast:
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    model.train()
    for _ in range(args.warmup):
        step()
    if ddp is not None:
        ddp.barrier()
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(args.steps):
            loss_sum += step()
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
    else:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss_sum += step()
        seconds = time.perf_counter() - t0
    return seconds, loss_sum.item() / args.steps


def result(args, model_name, device, ranks, seconds, loss, device_name):
    return {"program": "pytorch", "model": model_name, "shape": list(args.shape), "batch": args.batch,
            "classes": args.classes, "precision": args.precision, "device": str(device), "device_name": device_name,
            "ranks": ranks, "warmup": args.warmup, "steps": args.steps, "ms_per_step": seconds * 1e3 / args.steps,
            "images_per_s": ranks * args.batch * args.steps / seconds, "loss": loss,
            "torch": torch.__version__, "channels_last": args.channels_last, "tf32": args.tf32}


def describe(args, where, device, ranks, device_name):
    blas = os.environ.get("OPENBLAS_CORETYPE", "unset (OpenBLAS chooses)")
    extra = (f"channels_last {args.channels_last}, cudnn.benchmark True, tf32 {args.tf32}" if device.type == "cuda"
             else f"{args.threads} thread(s) per process, OPENBLAS_CORETYPE {blas}, channels_last {args.channels_last}")
    print(f"# torch_resnet.py: {args.model} ({where}) on {device_name}; torch {torch.__version__}; {ranks} process(es)"
          f"{', DDP over gloo' if args.nproc else ''}; step = forward + cross_entropy + backward + SGD "
          f"(lr {args.lr}, momentum {args.momentum}){', autocast bf16' if args.precision == 'bf16' else ''}; {extra}")
    print(f"# warmup {args.warmup} steps, timed {args.steps} steps "
          f"({'CUDA events' if device.type == 'cuda' else 'perf_counter'})\n#")


def run_step(args):
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_resnet.py: --device cuda but torch.cuda.is_available() is False")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if args.channels_last is None:
        args.channels_last = cuda
    setup_backends(args, cuda)
    torch.manual_seed(args.seed)
    model, where = make_model(args.model, args.classes)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(device, memory_format=fmt)
    x, y = random_batch(args, device, args.seed + 1)
    x = x.contiguous(memory_format=fmt)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    seconds, loss = timed_steps(args, model, x, y, device)
    r = result(args, args.model, device, 1, seconds, loss, name)
    describe(args, where, device, 1, name)
    print_header()
    print_row(r)
    return r


def run_ddp_rank(args):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    setup_backends(args, False)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if args.channels_last is None:
        args.channels_last = False
    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model, where = make_model(args.model, args.classes)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = DDP(model.to(memory_format=fmt))
    x, y = random_batch(args, device, args.seed + 1 + rank)
    x = x.contiguous(memory_format=fmt)
    seconds, loss = timed_steps(args, model, x, y, device, ddp=dist)
    stats = torch.tensor([seconds, loss], dtype=torch.float64)
    slowest = stats.clone()
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    dist.all_reduce(stats)  # the loss averaged over the ranks
    r = result(args, args.model, device, world, slowest[0].item(), stats[1].item() / world, "cpu")
    if rank == 0:
        describe(args, where, device, world, "cpu")
        print_header()
        print_row(r)
        if args.json:
            write_json(args.json, r)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawned(local_rank, args, port):
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(args.nproc),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    run_ddp_rank(args)


def write_json(path, r):
    with open(path, "w") as f:
        json.dump(r, f, indent=2, sort_keys=True)
        f.write("\n")


def shape_arg(s):
    dims = [int(v) for v in s.split(",")]
    if len(dims) != 3 or min(dims) <= 0:
        raise argparse.ArgumentTypeError(f"--shape wants C,H,W (three positive integers), got {s}")
    return tuple(dims)


# ---- the parity and interop tests: make, check, weights, load (see the top of this file) -------------------
# They need numpy, torchvision and ckpt.py / parity.py (beside this file, on sys.path when this runs as a
# script); the benchmark needs none of them (it writes the architecture out where torchvision is missing).
try:
    import numpy as np  # noqa: E402
    import torchvision  # noqa: E402
    from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet  # noqa: E402

    import ckpt  # noqa: E402
    from parity import bf16_like_autocast, close, rel_err  # noqa: E402
except ImportError as e:
    PARITY_MISSING = e
else:
    PARITY_MISSING = None


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


# A ReLU input within rounding of 0 may come out on either side of it in another implementation (a float32 sum in
# another order): its mask flips there, and every gradient upstream of that ReLU moves by that one element's share.
# The small-stem net's 28x28 layers hold 200k values a ReLU, some within 1e-6 of 0: oneDNN's AVX2 kernels flipped
# one where its AVX-512 ones and torch did not, moving layer1's gradients by 5e-3 of their largest while every
# convolution was within 2e-6 of a float64 loop. So `check` finds, in float64, the ReLU inputs within NEAR_TIE of 0
# (relative to that ReLU's largest input: a few times float32's worst convolution error seen), each one's effect on
# every gradient (a backward pass with that one mask flipped), and takes off the difference between dptrain's and
# torch's gradients the flips that explain it best, each whole or not at all (least squares, rounded to -1, 0 or 1);
# what is left must be within the float32 tolerance. A defect would have to look exactly like a flipped mask to hide.
NEAR_TIE = 4e-6


class MaskedReLU(nn.Module):
    """ReLU whose mask can be flipped at one position of its k-th call (a block calls its ReLU twice)."""

    def __init__(self):
        super().__init__()
        self.calls, self.flip, self.ties = 0, None, []  # flip: (call, flat index); ties: the (call, flat index) found

    def forward(self, x):
        call, self.calls = self.calls, self.calls + 1
        mask = x > 0
        v = x.detach().abs().flatten()
        self.ties += [(call, int(i)) for i in torch.nonzero(v < NEAR_TIE * v.max()).flatten()]
        if self.flip is not None and self.flip[0] == call:
            mask = mask.flatten().clone()
            mask[self.flip[1]] = ~mask[self.flip[1]]
            mask = mask.view_as(x)
        return x * mask


def flip_effects(model, x, y, names):
    """Each near-tie ReLU mask flip's effect on the gradients of `names` (float64), flattened: a row each of a float32
    matrix (flips x gradient elements)."""
    m = copy.deepcopy(model).double()
    m.train()
    relus = []
    for mod in list(m.modules()):
        for child_name, child in list(mod.named_children()):
            if isinstance(child, nn.ReLU):
                setattr(mod, child_name, MaskedReLU())
                relus.append(getattr(mod, child_name))
    params = dict(m.named_parameters())

    def grads(flip_at=None):
        for r in relus:
            r.calls, r.ties, r.flip = 0, [], None
        if flip_at is not None:
            flip_at[0].flip = flip_at[1]
        m.zero_grad()
        nn.functional.cross_entropy(m(x.double()), y).backward()
        return torch.cat([params[n].grad.detach().flatten() for n in names])

    base = grads()
    ties = [(r, t) for r in relus for t in r.ties]
    effects = np.empty((len(ties), base.numel()), dtype=np.float32)
    for i, (r, t) in enumerate(ties):
        effects[i] = (grads((r, t)) - base).float().numpy()
    return effects


def explain_flips(got, want, names, model, x, y):
    """got - want per name, less the near-tie flips that explain it best; and how many flips were taken off."""
    r = np.concatenate([(np.asarray(got[n], np.float64) - np.asarray(want[n], np.float64)).ravel() for n in names])
    effects = flip_effects(model, x, y, [n[len("grad."):] for n in names])
    taken = 0
    if len(effects):
        # The normal equations in float32 (one matrix product; their rounding is far below the -1/0/1 rounding).
        gram = (effects @ effects.T).astype(np.float64)
        rhs = (effects @ r.astype(np.float32)).astype(np.float64)
        coef = np.rint(np.clip(np.linalg.lstsq(gram, rhs, rcond=None)[0], -1, 1))
        r -= coef.astype(np.float32) @ effects
        taken = int(np.abs(coef).sum())
    out, at = {}, 0
    for n in names:
        size = int(np.asarray(want[n]).size)
        out[n] = r[at:at + size]
        at += size
    return out, len(effects), taken


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
    # The difference in gradients, less the ReLU mask flips that explain it (the model as `make` saved it).
    model = build()
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in ckpt.load(os.path.join(d, "weights.safetensors")).items()})
    inp = ckpt.load(os.path.join(d, "input.safetensors"))
    x, y = torch.from_numpy(np.array(inp["x"])), torch.from_numpy(np.array(inp["y"])).long()
    grad_names = [n for n in want if n.startswith("grad.")]
    explained, ties, taken = explain_flips(got, want, grad_names, model, x, y)
    print(f"{variant}: {ties} ReLU input(s) within {NEAR_TIE:g} of 0 (float64); {taken} flipped mask(s) taken off the "
          f"gradients' difference")
    for name in want:
        if name == "loss":
            if abs(float(got[name]) - float(want[name])) > 1e-5 * max(1.0, abs(float(want[name]))):
                sys.exit(f"FAIL loss {float(got[name])} vs {float(want[name])}")
        elif name in ("logits", "eval_logits"):
            worst["logits"] = max(worst["logits"], close(name, got[name], want[name], 1e-4))
        elif name.startswith("grad."):
            residual = explained[name]
            scale = max(float(np.abs(np.asarray(want[name])).max()), 1e-12)
            if np.abs(residual).max() > 2e-3 * scale:
                sys.exit(f"FAIL {name}: max |dptrain - torch| = {np.abs(residual).max():.3g} (past {taken} flipped "
                         f"ReLU mask(s)) > 2e-3 x {scale:.3g}")
            worst["grad"] = max(worst["grad"], float(np.abs(residual).max()) / scale)
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


def parity_main(argv):
    """The tests' subcommands: argv = [make|check|weights|load, ...] (the program's arguments)."""
    if PARITY_MISSING is not None:
        sys.exit(f"torch_resnet.py {argv[0]}: {PARITY_MISSING} (the parity commands need numpy and torchvision)")
    torch.set_num_threads(1)
    cmd = argv[0]
    if cmd == "make":
        make(argv[1], argv[2])
    elif cmd == "check":
        check(argv[1], argv[2])
    elif cmd == "weights":  # ARCH CLASSES FILE, repeated: one Python start for several files
        for i in range(1, len(argv) - 1, 3):
            torch.manual_seed(7)
            model = getattr(torchvision.models, argv[i])(num_classes=int(argv[i + 1]))
            ckpt.save(argv[i + 2], state_arrays(model))
    elif cmd == "load":
        model = getattr(torchvision.models, argv[1])(num_classes=int(argv[2]))
        state = {k: torch.from_numpy(np.array(v)) for k, v in ckpt.load(argv[3]).items()}
        model.load_state_dict(state, strict=True)
        print(f"loaded {len(state)} tensors into torchvision.models.{argv[1]}(num_classes={argv[2]}) strictly")
    else:
        sys.exit(f"unknown command {cmd}")


PARITY_COMMANDS = ("make", "check", "weights", "load")


def main():
    if sys.argv[1:2] and sys.argv[1] in PARITY_COMMANDS:
        return parity_main(sys.argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(_LAYERS), default="resnet18")
    p.add_argument("--batch", type=int, default=256, help="examples per step (per process in ddp mode)")
    p.add_argument("--shape", type=shape_arg, default=(3, 32, 32), help="one example's shape C,H,W")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="step mode only")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=1, help="CPU threads per process")
    p.add_argument("--channels-last", dest="channels_last", action="store_true", default=None,
                   help="channels_last memory format (default: on for cuda, off for the CPU)")
    p.add_argument("--no-channels-last", dest="channels_last", action="store_false")
    p.add_argument("--tf32", action="store_true", help="let FP32 convolutions and matmuls use TF32 (default: off)")
    p.add_argument("--nproc", type=int, default=0, help="ddp mode: this many processes, DDP over gloo on the CPU")
    p.add_argument("--json", help="also write the result to this file as JSON")
    args = p.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.batch < 1 or args.classes < 1:
        p.error("--steps and --batch and --classes must be positive, --warmup at least 0")

    if args.nproc > 0:
        if args.device == "cuda":
            p.error("ddp mode runs on the CPU (gloo); leave --device out")
        import torch.multiprocessing as mp

        mp.spawn(spawned, args=(args, free_port()), nprocs=args.nproc, join=True)
    else:
        r = run_step(args)
        if args.json:
            write_json(args.json, r)


if __name__ == "__main__":
    main()
