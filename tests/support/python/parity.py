"""tests/support/python/parity.py: the comparisons the PyTorch parity tests share (torch_resnet.py,
torch_gpt.py): a tensor close to the reference relative to the reference's largest magnitude, and the bf16 rule
(dptrain's bf16 must be about as far from fp32 as torch.autocast's bf16)."""
import sys

import numpy as np


def rel_err(a, b):
    """max |a - b| over max |b|."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max()) / max(float(np.abs(b).max()), 1e-12)


def close(name, got, want, rel):
    """Exits with a FAIL line unless max |got - want| <= rel * max |want|; returns the relative error."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        sys.exit(f"FAIL {name}: shape {got.shape} vs {want.shape}")
    scale = max(float(np.abs(want).max()), 1e-12)
    err = float(np.abs(got - want).max())
    if err > rel * scale:
        sys.exit(f"FAIL {name}: max |dptrain - torch| = {err:.3g} > {rel} x {scale:.3g}")
    return err / scale


def bf16_like_autocast(ref, torch_bf16, got, skip=()):
    """For every tensor of torch_bf16 (bar `skip`): dptrain's bf16 result `got` is at most 3x as far from the
    fp32 reference `ref` as torch autocast's, and its logits at least 0.2x as far (else it was not bf16).
    Exits with a FAIL line otherwise; returns (worst ratio, tensors compared)."""
    worst, n = 0.0, 0
    for name in torch_bf16:
        if name in skip:
            continue
        ours, theirs = rel_err(got[name], ref[name]), rel_err(torch_bf16[name], ref[name])
        if ours > 3 * theirs + 1e-4:
            sys.exit(f"FAIL {name}: dptrain bf16 is {ours:.3g} from fp32, torch autocast {theirs:.3g}")
        if name == "logits" and ours < 0.2 * theirs:
            sys.exit(f"FAIL logits: dptrain bf16 is only {ours:.3g} from fp32 (torch autocast {theirs:.3g}): not bf16")
        worst = max(worst, ours / max(theirs, 1e-12))
        n += 1
    return worst, n
