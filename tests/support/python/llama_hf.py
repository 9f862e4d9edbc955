#!/usr/bin/env python3
"""tests/support/python/llama_hf.py: Hugging Face transformers' LlamaForCausalLM and Qwen2ForCausalLM, the reference of
dptrain's Llama family (integration.llama_hf_parity). Runs in the test venv (transformers 4.45 over Debian's torch
1.13, CPU, float32).

  llama_hf.py make VARIANT DIR     a tiny random model saved by save_pretrained into DIR/model (the variant says how:
                                   safetensors, sharded safetensors, bf16, pytorch_model.bin) and DIR/input.safetensors
                                   (x.<i>, y.<i> [B, T], int64: three batches of random tokens)
  llama_hf.py check VARIANT DIR    compares DIR/out (dpt-llama-io on DIR/model) with the model from_pretrained:
                                   batch 0's logits and loss to 1e-5, every parameter's gradient to 1e-4 of its
                                   largest, then STEPS AdamW steps over the batches in turn (torch.optim.AdamW, weight
                                   decay on the matrices only, as dptrain's auto grouping): each step's loss to 1e-5
                                   and the final weights to 1e-4
  llama_hf.py logits DIR INPUT OUT the logits of a folder from_pretrained (AutoModelForCausalLM) on INPUT's x.0
  llama_hf.py bench [--threads N] [--batch B] [--warmup W] [--steps S]
                                   the twin of `dpt-model-bench --config configs/llama_tiny.toml` on the CPU:
                                   LlamaForCausalLM of llama_tiny's shape (4 layers, 4 query heads over 2, 128 wide,
                                   SwiGLU 384, vocabulary 256, untied), one batch of random tokens [B, 65], then W
                                   untimed and S timed steps of forward + mean cross-entropy + backward + AdamW (lr
                                   1e-3, betas (0.9, 0.95), weight decay 0.1 on the matrices); prints tokens/s

Variants (weights N(0, 0.2): attention far from uniform, so its gradient matters; RMSNorm weights not all 1):
  llama_mha        Llama, 4 heads, untied head, model.safetensors in float16 (dptrain widens; the reference loads the
                   same fp16 values as float32)
  llama_gqa_tied   Llama, 4 query heads over 2 key/value heads, tied head, Llama 3 rope scaling, head_dim 6 (not
                   hidden / heads), attention_bias and mlp_bias, sharded (several model-*.safetensors + index)
  qwen2_bf16       Qwen2 (biases on q, k, v), 4 heads over 1, saved in bfloat16 (dptrain widens; the reference
                   loads the same bf16 values as float32)
  llama_bin        Llama, 2 heads over 1, pytorch_model.bin (torch.save's zip)
"""
import os
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt  # noqa: E402

B, T, VOCAB, BATCHES = 2, 8, 256, 3
LR, WD, BETAS, EPS = 1e-3, 0.1, (0.9, 0.95), 1e-8


def config(variant):
    common = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=40, num_hidden_layers=2,
                  max_position_embeddings=16, rms_norm_eps=1e-5, initializer_range=0.2, hidden_act="silu",
                  bos_token_id=1, eos_token_id=2)
    if variant == "llama_mha":
        return transformers.LlamaConfig(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
                                        rope_theta=100.0, **common)
    if variant == "llama_gqa_tied":
        return transformers.LlamaConfig(
            num_attention_heads=4, num_key_value_heads=2, head_dim=6, tie_word_embeddings=True, rope_theta=500.0,
            attention_bias=True, mlp_bias=True,
            rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                              original_max_position_embeddings=8), **common)
    if variant == "qwen2_bf16":
        return transformers.Qwen2Config(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False,
                                        rope_theta=1000.0, use_sliding_window=False, **common)
    if variant == "llama_bin":
        return transformers.LlamaConfig(num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
                                        **common)
    raise SystemExit(f"unknown variant {variant}")


def make(variant, d):
    torch.manual_seed(7)
    cfg = config(variant)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float()
    with torch.no_grad():  # RMSNorm weights around 1, not all 1; biases not 0
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    out = os.path.join(d, "model")
    if variant == "llama_gqa_tied":
        model.save_pretrained(out, max_shard_size="20KB")
    elif variant == "qwen2_bf16":
        model.to(torch.bfloat16).save_pretrained(out)
    elif variant == "llama_mha":
        model.half().save_pretrained(out)
    elif variant == "llama_bin":
        model.save_pretrained(out, safe_serialization=False)
    else:
        model.save_pretrained(out)
    g = torch.Generator().manual_seed(11)
    tensors = {}
    for i in range(BATCHES):
        w = torch.randint(0, VOCAB, (B, T + 1), generator=g)
        tensors[f"x.{i}"] = w[:, :-1].numpy().astype(np.int64)
        tensors[f"y.{i}"] = w[:, 1:].numpy().astype(np.int64)
    ckpt.save(os.path.join(d, "input.safetensors"), tensors)


def load(d):
    return transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager")


def close(name, got, want, tol, scale=None):
    got = torch.as_tensor(np.asarray(got, dtype=np.float64))
    want = want.detach().double()
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)}, want {tuple(want.shape)}"
    err = (got - want).abs().max().item()
    ref = max(1.0, want.abs().max().item()) if scale is None else scale
    ok = err <= tol * ref
    print(f"{'ok ' if ok else 'BAD'} {name}: max |dptrain - transformers| {err:.2e} (tolerance {tol * ref:.2e})")
    return ok


def check(variant, d, steps):
    model = load(os.path.join(d, "model"))
    inp = ckpt.load(os.path.join(d, "input.safetensors"))
    out = ckpt.load(os.path.join(d, "out", "out.safetensors"))
    state = ckpt.load(os.path.join(d, "out", "state.safetensors"))
    xs = [torch.from_numpy(inp[f"x.{i}"]) for i in range(BATCHES)]
    ys = [torch.from_numpy(inp[f"y.{i}"]) for i in range(BATCHES)]

    def loss_of(i):
        logits = model(xs[i]).logits
        return logits, torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ys[i].reshape(-1))

    ok = True
    model.zero_grad()
    logits, loss = loss_of(0)
    loss.backward()
    ok &= close("logits", out["logits"], logits.reshape(-1, VOCAB), 1e-5)
    ok &= close("loss", out["loss"], loss, 1e-5)
    params = dict(model.named_parameters())
    names = set(params)
    got = {k[len("grad."):] for k in out if k.startswith("grad.")}
    if got != names:
        print(f"BAD parameter names: dptrain only {sorted(got - names)}, transformers only {sorted(names - got)}")
        return False
    for name, p in params.items():
        g = p.grad
        ok &= close(f"grad {name}", out["grad." + name], g, 1e-4, max(g.abs().max().item(), 1e-6))
    decay = [p for n, p in params.items() if p.dim() >= 2]
    other = [p for n, p in params.items() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": other, "weight_decay": 0.0}], lr=LR,
                            betas=BETAS, eps=EPS)
    for s in range(steps):
        opt.zero_grad()
        _, loss = loss_of(s % BATCHES)
        loss.backward()
        opt.step()
        ok &= close(f"step {s} loss", out[f"loss.{s}"], loss, 1e-5)
    for name, p in params.items():
        ok &= close(f"after {steps} steps {name}", state[name], p, 1e-4)
    return ok


def logits(d, inp, out):
    model = load(d)
    x = torch.from_numpy(ckpt.load(inp)["x.0"])
    with torch.no_grad():
        ckpt.save(out, {"logits": model(x).logits.reshape(x.numel(), -1).double().numpy()})


def bench(argv):
    import argparse
    import time
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).float()
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    w = torch.randint(0, 256, (a.batch, 65))
    x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    dt = (time.perf_counter() - t0) / a.steps
    print(f"transformers {transformers.__version__} torch {torch.__version__} LlamaForCausalLM llama_tiny, batch "
          f"{a.batch} T 64, {a.threads} thread(s): {dt * 1e3:.2f} ms/step, {a.batch * 64 / dt:.0f} tokens/s, "
          f"loss {loss.item():.4f}")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "make":
        make(sys.argv[2], sys.argv[3])
    elif cmd == "check":
        sys.exit(0 if check(sys.argv[2], sys.argv[3], int(sys.argv[4])) else 1)
    elif cmd == "logits":
        logits(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "bench":
        bench(sys.argv[2:])
    else:
        raise SystemExit(__doc__)
