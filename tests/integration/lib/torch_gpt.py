"""tests/integration/lib/torch_gpt.py: the PyTorch side of the GPT parity test (Debian's python3-torch, CPU,
reference only). The model is written here in nanoGPT's shape and names (token and position embeddings,
pre-LayerNorm blocks with fused-QKV causal self-attention and a GELU(tanh) MLP, final LayerNorm, LM head tied
to the token embedding); the attention is spelled out (masked softmax), since Debian's torch 1.13 has no
scaled_dot_product_attention. Tensors travel as safetensors (ckpt.py, numpy only).
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
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import ckpt  # noqa: E402
from parity import bf16_like_autocast, close  # noqa: E402

torch.set_num_threads(1)


class Attention(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c, 4 * c)
        self.c_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c)
        self.attn = Attention(c, heads)
        self.ln_2 = nn.LayerNorm(c)
        self.mlp = Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab, block):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, n_embd), wpe=nn.Embedding(block, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]), ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, idx):
        t = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


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
    model = GPT(n_layer, n_head, n_embd, vocab, block)
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


def main():
    cmd, variant, d = sys.argv[1:4]
    if cmd == "make":
        make(variant, d)
    elif cmd == "check":
        check(variant, d)
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
