#!/usr/bin/env python3
"""tests/support/python/torch_gpt.py: the PyTorch reference GPT, for the benchmark and for the parity test.

One model (nanoGPT's, below) with two entry points:
  - the benchmark (scripts/bench/gpt_bench.sh, scripts/gpu-check.sh): the twin of dpt-model-bench, options below;
  - the parity test (tests/integration/gpt_torch_parity.sh): the subcommands `make` and `check`, at the end of
    this text.

GPT-2 written out here as nanoGPT writes it (model.py): token and position embeddings, pre-LayerNorm blocks
(causal self-attention through F.scaled_dot_product_attention(is_causal=True) with a fused QKV projection, an
MLP with GELU(tanh)), a final LayerNorm, the LM head tied to the token embedding; GPT-2's initialisation
(N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 n_layer))). The vocabulary is padded to a multiple
of 128 (50257 -> 50304), as nanoGPT pads it and as dptrain pads wte and the logits (models::padded_vocab), so
both programs run GEMMs of the same size; here, as in nanoGPT, the padding columns are ordinary logits (dptrain
holds them at -inf), which costs the same FLOPs.

The workload of dpt-model-bench's GPT rows: one batch of --batch windows of --seq + 1 synthetic tokens
(uniform in [0, vocab)) made once on the device, inputs the first --seq tokens, targets the next ones; then
--warmup untimed and --steps timed training steps: forward + mean cross-entropy over every position, backward,
AdamW (lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the matrices only: nanoGPT's
configure_optimizers; fused=True on CUDA where this torch has it), no gradient clipping, as dpt-model-bench.

  --mode eager     the model as it is
  --mode compile   torch.compile(model) (the optimizer step stays eager, as nanoGPT); the first steps compile,
                   so --warmup must be at least 1. A torch without torch.compile (Debian's 1.13) skips it with
                   a message and exit status 77.
  --precision bf16 forward and loss under torch.autocast(dtype=torch.bfloat16) (weights, gradients and AdamW
                   in fp32), the default on CUDA; fp32 without autocast, the default on the CPU. TF32 off unless
                   --tf32.

Timing: torch.cuda.synchronize() before and after the timed steps, wall clock between them (CPU: wall clock).
tokens/s = batch * seq * steps / time. MFU = tokens/s * (6 N + 12 n_layer seq n_embd) / peak, N = the
parameters without wpe (the tied head counted once, the padding rows of wte included: the same N as dptrain's
models::gpt_num_params(o, false)), peak = the dense bf16 peak of the device by its name, the table of
dptrain's core/cuda.cpp (dense_bf16_peak_flops); MFU is "-" on the CPU and on a GPU not in the table.

Prints the fixed-width row of dpt-model-bench's GPT table (program, mode, model, seq, batch, precision, device,
time/step, tokens/s, MFU, loss) and, with --json FILE, the result as JSON. --profile-steps N: after the timed
steps, N more under torch.profiler; the CUDA kernels (or, on the CPU, the operators) by total time, written
to --profile-out (default: stdout, as comment lines).

  python3 tests/support/python/torch_gpt.py --mode compile                  # GPT-2 124M, T 1024, batch 16, cuda
  python3 tests/support/python/torch_gpt.py --device cpu --n-layer 2 --n-head 2 --n-embd 64 --vocab 256 --seq 64 --batch 4

Parity (Debian's python3-torch, CPU; numpy, ckpt.py and parity.py beside this file). The model at small
shapes with weights larger than GPT-2's 0.02 and non-trivial LayerNorm affines, the attention spelled out
(masked softmax) on every torch. Tensors travel as safetensors (ckpt.py, numpy only).
  torch_gpt.py make VARIANT DIR    weights.safetensors (the state_dict, lm_head.weight included: the tie; for
                                   tiny_hf in Hugging Face's layout: no prefix, Conv1D weights transposed),
                                   input.safetensors (x, y [B, T]), expected.safetensors (logits [B*T, V],
                                   loss, grad.<param>), DIR/args (dpt-gpt-io's shape arguments); bf16 variants
                                   add torch_bf16.safetensors (the same step under torch.autocast bfloat16)
  torch_gpt.py check VARIANT DIR   compares DIR/out/out.safetensors (dpt-gpt-io) with the expectation; loads
                                   DIR/out/state.safetensors into the torch model with strict=True (the tied
                                   head restored from wte) and needs the same logits
Tolerances (fp32, different summation orders): logits within 1e-4 of their largest magnitude, each gradient
within 2e-3 of its own largest, the loss within 1e-5 relative. bf16: dptrain's distance from fp32 within 0.2x
to 3x torch autocast's, tensor by tensor.
"""
import argparse
import inspect
import json
import math
import os
import sys
import time


import threads  # noqa: E402,F401  (sets the thread counts; before torch)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

EXIT_SKIPPED = 77
HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")

# Dense (not sparse) bf16 tensor-core peaks, TFLOP/s, from NVIDIA's data sheets; the first match wins. The
# same table as dptrain's dense_bf16_peak_flops (core/cuda.cpp): keep the two equal.
PEAKS = (("H100", "PCIe", 756), ("H100", "NVL", 835), ("H100", None, 989), ("H200", None, 989),
         ("H800", None, 989), ("A100", None, 312), ("A800", None, 312))


def dense_bf16_peak_flops(name):
    for a, b, tflops in PEAKS:
        if a in name and (b is None or b in name):
            return tflops * 1e12
    return 0.0


def padded(vocab, multiple=128):
    return (vocab + multiple - 1) // multiple * multiple


# ---- the model: nanoGPT's ---------------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self, c, n_head, sdpa=HAVE_SDPA):
        super().__init__()
        self.n_head = n_head
        self.sdpa = sdpa
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0 (Debian's 1.13), and the parity test on every torch: the same arithmetic, written out
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c, 4 * c)
        self.c_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c, n_head, sdpa=HAVE_SDPA):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(c), CausalSelfAttention(c, n_head, sdpa)
        self.ln_2, self.mlp = nn.LayerNorm(c), MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """PyTorch's default initialisation; the benchmark then applies GPT-2's (init_gpt2_), the parity test its
    own (parity_model). sdpa: attention through F.scaled_dot_product_attention (where this torch has it)."""

    def __init__(self, n_layer, n_head, n_embd, vocab, block_size, sdpa=HAVE_SDPA):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head, sdpa) for _ in range(n_layer)]), ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied

    def init_gpt2_(self):
        """GPT-2's initialisation: N(0, 0.02), zero biases, the residual projections N(0, 0.02 / sqrt(2 L))."""
        self.apply(self._init_weights)
        n_layer = len(self.transformer.h)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
        return self

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        """The logits [B, T, V]; with targets, the mean cross-entropy over every position instead."""
        T = idx.size(1)
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def num_params_without_wpe(model):
    """Parameters counted once (the tied head is wte), without the position embedding."""
    return sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()


def make_optimizer(model, args, cuda):
    """nanoGPT's configure_optimizers: weight decay for the tensors of 2 or more dimensions only."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    kw = {}
    fused = cuda and "fused" in inspect.signature(torch.optim.AdamW).parameters
    if fused:
        kw["fused"] = True
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps, **kw)
    return opt, fused


# ---- one mode's run ---------------------------------------------------------------------------------------


def random_batch(args, vocab, device):
    g = torch.Generator().manual_seed(args.seed + 1)
    w = torch.randint(0, vocab, (args.batch, args.seq + 1), generator=g)
    return w[:, :-1].contiguous().to(device), w[:, 1:].contiguous().to(device)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args):
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_gpt.py: --device cuda but torch.cuda.is_available() is False")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if args.precision is None:
        args.precision = "bf16" if cuda else "fp32"
    if args.mode == "compile" and not hasattr(torch, "compile"):
        print(f"# torch_gpt.py: mode compile SKIPPED: torch {torch.__version__} has no torch.compile (PyTorch 2.0+)",
              flush=True)
        sys.exit(EXIT_SKIPPED)
    if args.mode == "compile" and args.warmup < 1:
        sys.exit("torch_gpt.py: --mode compile needs --warmup >= 1 (the first step compiles)")
    torch.set_num_threads(args.threads)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32

    vocab = padded(args.vocab) if args.pad_vocab else args.vocab
    torch.manual_seed(args.seed)
    model = GPT(args.n_layer, args.n_head, args.n_embd, vocab, args.block_size or args.seq).init_gpt2_().to(device)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    n = num_params_without_wpe(model)
    flops_per_token = 6 * n + 12 * args.n_layer * args.seq * args.n_embd
    opt, fused = make_optimizer(model, args, cuda)
    step_model = torch.compile(model) if args.mode == "compile" else model
    x, y = random_batch(args, args.vocab, device)  # tokens from the real vocabulary, never a padding row
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    loss_sum = torch.zeros((), device=device)

    def step():
        with autocast:
            loss = step_model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    t_warm = time.perf_counter()
    for _ in range(args.warmup):
        step()
    sync(device)
    warmup_s = time.perf_counter() - t_warm
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss_sum += step()
    sync(device)
    seconds = time.perf_counter() - t0
    loss = loss_sum.item() / args.steps

    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    peak = dense_bf16_peak_flops(name) if cuda else 0.0
    tokens_per_s = args.batch * args.seq * args.steps / seconds
    model_name = f"gpt-L{args.n_layer}-C{args.n_embd}"
    r = {"program": "pytorch", "mode": args.mode, "model": model_name, "seq": args.seq, "batch": args.batch,
         "precision": args.precision, "device": str(device), "device_name": name, "ranks": 1,
         "warmup": args.warmup, "steps": args.steps, "warmup_s": warmup_s, "ms_per_step": seconds * 1e3 / args.steps,
         "sequences_per_s": args.batch * args.steps / seconds, "tokens_per_s": tokens_per_s, "loss": loss,
         "vocab": args.vocab, "padded_vocab": vocab, "params": n_params, "params_no_wpe": n,
         "flops_per_token": flops_per_token, "peak_flops": peak,
         "mfu": tokens_per_s * flops_per_token / peak if peak > 0 else None,
         "torch": torch.__version__, "fused_adamw": fused, "sdpa": HAVE_SDPA, "tf32": args.tf32}
    autocast_note = ", autocast bf16" if args.precision == "bf16" else ""
    attention = ("F.scaled_dot_product_attention(is_causal=True)" if HAVE_SDPA
                 else "written out (this torch has no SDPA)")
    threads = "" if cuda else f"; {args.threads} thread(s)"
    peak_note = f"{peak / 1e12:.0f} TFLOP/s" if peak > 0 else "- (unknown here)"
    compiled = ", compilation included" if args.mode == "compile" else ""
    clock = "torch.cuda.synchronize + perf_counter" if cuda else "perf_counter"
    print(f"# torch_gpt.py: {model_name} (nanoGPT's GPT-2, {n_params} parameters, vocab {args.vocab} padded to "
          f"{vocab}) on {name}; torch {torch.__version__}; mode {args.mode}; step = forward + cross_entropy + "
          f"backward + AdamW (fused {fused}, lr {args.lr}, betas ({args.beta1}, {args.beta2}), weight decay "
          f"{args.weight_decay} on the matrices){autocast_note}; attention {attention}{threads}")
    print(f"# tokens: vocab {args.vocab} (padded to {vocab}), T {args.seq}; {flops_per_token:.4g} FLOP/token "
          f"(6 N + 12 L T C, N = {n} without wpe); MFU against a dense bf16 peak of {peak_note}")
    print(f"# warmup {args.warmup} steps ({warmup_s:.1f} s{compiled}), timed {args.steps} steps ({clock})\n#")
    print_header()
    print_row(r)
    if args.profile_steps > 0:
        profile(args, step, device)
    return r


def print_header():
    """The GPT table head of dpt-model-bench (bench/model_bench.cpp), column for column."""
    cols = ("program", "mode", "model", "seq", "batch", "precision", "device", "time/step", "tokens/s", "MFU", "loss")
    units = ("", "", "", "", "", "", "", "(ms)", "(1/s)", "(%)", "(mean)")
    for c in (cols, units):
        print("#{:>11}  {:>7}  {:>12}  {:>5}  {:>5}  {:>9}  {:>6}  {:>9}  {:>10}  {:>5}  {:>7}".format(*c))


def print_row(r):
    mfu = f"{100 * r['mfu']:.1f}" if r["mfu"] is not None else "-"
    print("{:>12}  {:>7}  {:>12}  {:>5}  {:>5}  {:>9}  {:>6}  {:>9.2f}  {:>10.0f}  {:>5}  {:>7.4f}".format(
        r["program"], r["mode"], r["model"], r["seq"], r["batch"], r["precision"], r["device"].split(":")[0],
        r["ms_per_step"], r["tokens_per_s"], mfu, r["loss"]), flush=True)


def profile(args, step, device):
    """--profile-steps more steps under torch.profiler: kernels (CUDA) or operators (CPU) by total time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=acts) as prof:
        for _ in range(args.profile_steps):
            step()
        sync(device)
    lines = [f"torch.profiler, {args.profile_steps} step(s), mode {args.mode}: "
             f"{'CUDA kernels' if cuda else 'operators'} by total time per step"]
    if cuda:
        # The kernels themselves: events on the device (not the CPU-side operators that launched them).
        by_name = {}
        for e in prof.events():
            if "CUDA" in str(getattr(e, "device_type", "")):  # a kernel (or a memcpy / memset) on the GPU
                t = e.time_range.elapsed_us()
                tot, cnt = by_name.get(e.name, (0.0, 0))
                by_name[e.name] = (tot + t, cnt + 1)
        total = sum(t for t, _ in by_name.values()) or 1.0
        lines.append(f"{'ms/step':>9}  {'%':>5}  {'calls/step':>10}  kernel")
        for name, (t, cnt) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:args.profile_top]:
            lines.append(f"{t / 1e3 / args.profile_steps:>9.3f}  {100 * t / total:>5.1f}  "
                         f"{cnt / args.profile_steps:>10.1f}  {name[:140]}")
        lines.append(f"{total / 1e3 / args.profile_steps:>9.3f}  100.0  {'':>10}  all kernels (sum of kernel times)")
    else:
        lines.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile_top))
    text = "\n".join(lines)
    if args.profile_out:
        with open(args.profile_out, "w") as f:
            f.write(text + "\n")
    else:
        print("\n".join("# " + ln for ln in text.splitlines()), flush=True)


# ---- the parity test: `make VARIANT DIR`, `check VARIANT DIR` (see the top of this file) -----------------
# They need numpy and ckpt.py / parity.py (beside this file, on sys.path when this runs as a script); the
# benchmark needs none of them.
try:
    import numpy as np  # noqa: E402

    import ckpt  # noqa: E402
    from parity import bf16_like_autocast, close  # noqa: E402
except ImportError as e:
    PARITY_MISSING = e
else:
    PARITY_MISSING = None


# name -> (n_layer, n_head, n_embd, vocab, block_size, B, T). "odd": odd sizes, one head, T < block_size.
VARIANTS = {
    "tiny": (2, 4, 32, 67, 16, 3, 16),
    "odd": (3, 1, 12, 29, 9, 2, 7),
}
BF16 = {"tiny_bf16": "tiny"}
# The same model and batch, the weights written as Hugging Face's GPT2LMHeadModel keeps them (see hf_state).
HF = {"tiny_hf": "tiny"}


CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def hf_state(model):
    """The state as the hub's GPT-2 model.safetensors holds it: no "transformer." prefix, the four projection
    weights transposed (HF's Conv1D stores [in, out]), each block's causal-mask buffer attn.bias, no lm_head."""
    out = {}
    for k, v in model.state_dict().items():
        if k == "lm_head.weight":
            continue
        v = v.detach().numpy()
        if k.endswith(CONV1D):
            v = np.ascontiguousarray(v.T)
        out[k[len("transformer."):]] = v
    block = model.transformer.wpe.weight.shape[0]
    for i in range(len(model.transformer.h)):
        out[f"h.{i}.attn.bias"] = np.tril(np.ones((block, block), dtype=np.float32)).reshape(1, 1, block, block)
    return out


def from_hf(state):
    """hf_state's inverse (what transformers' GPT2LMHeadModel.from_pretrained does with such a file): the
    "transformer." prefix back, Conv1D weights transposed back, lm_head tied to wte."""
    out = {}
    for k, v in state.items():
        v = np.array(v)
        if k.endswith(CONV1D):
            v = np.ascontiguousarray(v.T)
        out["transformer." + k] = torch.from_numpy(v)
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def build(shape):
    n_layer, n_head, n_embd, vocab, block, _, _ = shape
    torch.manual_seed(4321)
    model = GPT(n_layer, n_head, n_embd, vocab, block, sdpa=False)
    # Weights larger than GPT-2's 0.02, and non-trivial LayerNorm affines, so every path carries signal.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                p.uniform_(0.5, 1.5)
            elif p.ndim == 1:
                p.uniform_(-0.1, 0.1)
            else:
                p.normal_(0.0, 0.2)
    return model


def step(model, x, y, autocast=False):
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(x)
    logits = logits.float().reshape(-1, logits.shape[-1])
    loss = F.cross_entropy(logits, y.reshape(-1))
    loss.backward()
    out = {"logits": logits.detach().numpy(), "loss": np.array(loss.item())}
    for name, p in model.named_parameters():  # lm_head.weight is wte itself: named once
        out["grad." + name] = p.grad.float().numpy()
    return out


def base(variant):
    return BF16.get(variant, HF.get(variant, variant))


def make(variant, d):
    shape = VARIANTS[base(variant)]
    model = build(shape)
    os.makedirs(d, exist_ok=True)
    weights = hf_state(model) if variant in HF else {k: v.detach().numpy() for k, v in model.state_dict().items()}
    ckpt.save(os.path.join(d, "weights.safetensors"), weights)
    g = torch.Generator().manual_seed(99)
    _, _, _, vocab, _, b, t = shape
    x = torch.randint(0, vocab, (b, t), generator=g)
    y = torch.randint(0, vocab, (b, t), generator=g)
    ckpt.save(os.path.join(d, "input.safetensors"), {"x": x.numpy(), "y": y.numpy()})
    ckpt.save(os.path.join(d, "expected.safetensors"), step(model, x, y))
    if variant in BF16:
        ckpt.save(os.path.join(d, "torch_bf16.safetensors"), step(model, x, y, autocast=True))
    n_layer, n_head, n_embd, vocab, block, _, _ = shape
    args = f"--n-layer {n_layer} --n-head {n_head} --n-embd {n_embd} --vocab {vocab} --block {block}"
    if variant in BF16:
        args += " --precision bf16"
    with open(os.path.join(d, "args"), "w") as f:
        f.write(args + "\n")


def check_bf16(variant, d):
    ref = ckpt.load(os.path.join(d, "expected.safetensors"))
    tb = ckpt.load(os.path.join(d, "torch_bf16.safetensors"))
    got = ckpt.load(os.path.join(d, "out", "out.safetensors"))
    worst, n = bf16_like_autocast(ref, tb, got, skip=("loss",))
    print(f"{variant}: dptrain bf16's distance from fp32 is at most {worst:.2f}x torch autocast's over {n} tensors")


def check(variant, d):
    if variant in BF16:
        return check_bf16(variant, d)
    want = ckpt.load(os.path.join(d, "expected.safetensors"))
    got = ckpt.load(os.path.join(d, "out", "out.safetensors"))
    if sorted(want) != sorted(got):
        sys.exit(f"FAIL tensor names differ: torch only {sorted(set(want) - set(got))[:5]}, "
                 f"dptrain only {sorted(set(got) - set(want))[:5]}")
    worst = {"logits": 0.0, "grad": 0.0}
    for name in want:
        if name == "loss":
            if abs(float(got[name]) - float(want[name])) > 1e-5 * max(1.0, abs(float(want[name]))):
                sys.exit(f"FAIL loss {float(got[name])} vs {float(want[name])}")
        elif name == "logits":
            worst["logits"] = close(name, got[name], want[name], 1e-4)
        else:
            worst["grad"] = max(worst["grad"], close(name, got[name], want[name], 2e-3))
    # dptrain's state -> the torch model, strictly (the tied head from wte): the same logits.
    model = build(VARIANTS[base(variant)])
    state = {k: torch.from_numpy(np.array(v)) for k, v in ckpt.load(os.path.join(d, "out", "state.safetensors")).items()}
    if not torch.equal(state["lm_head.weight"], state["transformer.wte.weight"]):
        sys.exit("FAIL the nanoGPT layout's lm_head.weight is not wte")
    model.load_state_dict(state, strict=True)
    x = torch.from_numpy(np.array(ckpt.load(os.path.join(d, "input.safetensors"))["x"]))
    with torch.no_grad():
        interop = model(x).reshape(-1, VARIANTS[base(variant)][3]).numpy()
    err = close("interop logits", interop, got["logits"], 1e-4)
    # The Hugging Face layout dptrain writes loads the same way (as GPT2LMHeadModel.from_pretrained would).
    model.load_state_dict(from_hf(ckpt.load(os.path.join(d, "out", "hf.safetensors"))), strict=True)
    with torch.no_grad():
        hf_logits = model(x).reshape(-1, VARIANTS[base(variant)][3]).numpy()
    if not np.array_equal(hf_logits, interop):
        sys.exit("FAIL the Hugging Face layout export gives other logits than the nanoGPT one")
    print(f"{variant}: {len(want)} tensors match; worst relative error: logits {worst['logits']:.2g}, gradients "
          f"{worst['grad']:.2g}; state loads into the torch GPT (strict, nanoGPT and Hugging Face layouts), "
          f"logits within {err:.2g}")


def parity_main(argv):
    """The tests' subcommands: argv = [make|check, VARIANT, DIR]."""
    if PARITY_MISSING is not None:
        sys.exit(f"torch_gpt.py {argv[0]}: {PARITY_MISSING} (the parity commands need numpy)")
    torch.set_num_threads(1)
    cmd, variant, d = argv[:3]
    if cmd == "make":
        make(variant, d)
    else:
        check(variant, d)


PARITY_COMMANDS = ("make", "check")


def main():
    if sys.argv[1:2] and sys.argv[1] in PARITY_COMMANDS:
        return parity_main(sys.argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["eager", "compile"], default="eager")
    p.add_argument("--n-layer", type=int, default=12)
    p.add_argument("--n-head", type=int, default=12)
    p.add_argument("--n-embd", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50257, help="the real vocabulary (tokens are drawn from it)")
    p.add_argument("--no-pad-vocab", dest="pad_vocab", action="store_false",
                   help="do not pad the vocabulary to a multiple of 128 (default: padded, 50257 -> 50304)")
    p.add_argument("--seq", type=int, default=1024, help="T: tokens per sequence")
    p.add_argument("--block-size", type=int, default=0, help="rows of wpe (default: --seq)")
    p.add_argument("--batch", type=int, default=16, help="sequences per step")
    p.add_argument("--precision", choices=["fp32", "bf16"], default=None,
                   help="bf16: autocast (default on cuda); fp32 (default on the CPU)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--threads", type=int, default=1, help="CPU threads")
    p.add_argument("--tf32", action="store_true", help="let FP32 matmuls use TF32 (default: off)")
    p.add_argument("--profile-steps", type=int, default=0, help="after the timed steps, this many under torch.profiler")
    p.add_argument("--profile-top", type=int, default=25, help="rows of the profile")
    p.add_argument("--profile-out", help="write the profile here (default: stdout, as comment lines)")
    p.add_argument("--json", help="also write the result to this file as JSON")
    args = p.parse_args()
    if min(args.steps, args.batch, args.seq, args.n_layer, args.n_head, args.n_embd, args.vocab) < 1 or args.warmup < 0:
        p.error("--steps, --batch, --seq, --n-layer, --n-head, --n-embd and --vocab must be positive, --warmup >= 0")
    if args.n_embd % args.n_head:
        p.error("--n-embd must be a multiple of --n-head")
    if args.block_size and args.block_size < args.seq:
        p.error("--block-size must be at least --seq")
    r = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2, sort_keys=True)
            f.write("\n")
    if not math.isfinite(r["loss"]):
        print(f"torch_gpt.py: the mean loss over the timed steps is {r['loss']}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
