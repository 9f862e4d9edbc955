"""tests/support/python/torch_files.py: PyTorch's own weight files for integration.torch_weights, written by
torch.save (Debian's torch 1.13), and the check of what dptrain read from them against torch.load's own reading.
  torch_files.py write DIR          writes, into DIR:
      resnet34.pth      torchvision.models.resnet34().state_dict() (seeded), as torchvision's downloads are
      gpt2_hf.bin       a 2-layer GPT-2 in Hugging Face's layout (wte, wpe, h.N.attn.c_attn.weight as Conv1D [in, out],
                        the attn.bias masks, ln_f), as an older hub repository's pytorch_model.bin
      zoo.pth           float16, bfloat16, float64, int64, int32, int16, int8, uint8 and bool tensors; a transposed
                        (non-contiguous) view, two views and a slice of one shared storage, a 0-dim tensor, an empty
                        one, an nn.Parameter
      training.pth      {'epoch': 3, 'model': a state dict, 'optimizer': SGD's state_dict()}: dptrain reads 'model'
      listed.pth        a list of tensors (refused: not a state dict)
      legacy.pth        the pre-1.6 format (_use_new_zipfile_serialization=False; refused, saying how to convert)
      os_system.pth     torch.save's layout, its data.pkl calling os.system (GLOBAL): refused, nothing run
      eval.pth          the same through STACK_GLOBAL builtins.eval
      newobj.pth        a NEWOBJ of an allowed global (refused: an opcode a state dict does not use)
  torch_files.py check PTH OUT      OUT (dpt-torch-file's safetensors of PTH) holds exactly torch.load(PTH)'s tensors
                                    (its 'model' entry for a training checkpoint): the same names in the same order,
                                    the dtypes dptrain keeps them in, the same shapes and bit-equal values
"""
import collections
import io
import os
import sys
import zipfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt  # noqa: E402

# torch dtype -> (the dtype dptrain keeps, numpy type of its values)
KEPT = {
    torch.float32: ("float32", np.float32), torch.float16: ("float32", np.float32),
    torch.bfloat16: ("bfloat16", np.float32), torch.float64: ("float64", np.float64),
    torch.int64: ("int64", np.int64), torch.int32: ("int32", np.int32), torch.int16: ("int32", np.int32),
    torch.int8: ("int32", np.int32), torch.uint8: ("uint8", np.uint8), torch.bool: ("uint8", np.uint8),
}


def gpt2_hf(n_layer=2, n_embd=64, block=32, vocab=96):
    g = torch.Generator().manual_seed(3)
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.05  # noqa: E731
    sd = collections.OrderedDict()
    sd["wte.weight"] = r(vocab, n_embd)
    sd["wpe.weight"] = r(block, n_embd)
    for i in range(n_layer):
        p = f"h.{i}."
        sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = 1 + r(n_embd), r(n_embd)
        sd[p + "attn.bias"] = torch.tril(torch.ones(block, block)).view(1, 1, block, block)
        sd[p + "attn.c_attn.weight"], sd[p + "attn.c_attn.bias"] = r(n_embd, 3 * n_embd), r(3 * n_embd)
        sd[p + "attn.c_proj.weight"], sd[p + "attn.c_proj.bias"] = r(n_embd, n_embd), r(n_embd)
        sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = 1 + r(n_embd), r(n_embd)
        sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"] = r(n_embd, 4 * n_embd), r(4 * n_embd)
        sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"] = r(4 * n_embd, n_embd), r(n_embd)
    sd["ln_f.weight"], sd["ln_f.bias"] = 1 + r(n_embd), r(n_embd)
    return sd


def zoo():
    g = torch.Generator().manual_seed(5)
    base = torch.randn(4, 6, generator=g)
    sd = collections.OrderedDict()
    sd["f16"] = (torch.randn(3, 5, generator=g) * 100).half()
    sd["f16_special"] = torch.tensor([0.0, -0.0, 6e-8, 6.1e-5, 65504.0, float("inf"), float("-inf")]).half()
    sd["bf16"] = torch.randn(2, 3, 4, generator=g).bfloat16()
    sd["f64"] = torch.randn(7, generator=g).double()
    sd["i64"] = torch.tensor([-(2 ** 62), -1, 0, 1, 2 ** 62], dtype=torch.int64)
    sd["i32"] = torch.tensor([-(2 ** 31), 0, 2 ** 31 - 1], dtype=torch.int32)
    sd["i16"] = torch.tensor([-32768, -1, 32767], dtype=torch.int16)
    sd["i8"] = torch.tensor([-128, -1, 127], dtype=torch.int8)
    sd["u8"] = torch.tensor([0, 1, 255], dtype=torch.uint8)
    sd["bool"] = torch.tensor([True, False, True])
    sd["shared"] = base                  # one storage, four tensors
    sd["shared_T"] = base.t()            # non-contiguous: strides (1, 6)
    sd["shared_row2"] = base[2]          # offset 12
    sd["shared_cols"] = base[1:, ::2]    # offset 6, strides (6, 2)
    sd["scalar"] = torch.tensor(7, dtype=torch.int64)  # 0-dim, as BatchNorm's num_batches_tracked
    sd["empty"] = torch.zeros(0, 3)
    sd["param"] = torch.nn.Parameter(torch.randn(2, 2, generator=g))
    return sd


def zip_like_torch(path, archive, pkl):
    """A file in torch.save's layout around a pickle of our own."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(f"{archive}/data.pkl", pkl)
        z.writestr(f"{archive}/version", "3\n")


def write(d):
    import torchvision

    os.makedirs(d, exist_ok=True)
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet34().state_dict(), os.path.join(d, "resnet34.pth"))
    torch.save(gpt2_hf(), os.path.join(d, "gpt2_hf.bin"))
    torch.save(zoo(), os.path.join(d, "zoo.pth"))
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    torch.save({"epoch": 3, "model": model.state_dict(), "optimizer": opt.state_dict(), "loss": 0.25},
               os.path.join(d, "training.pth"))
    torch.save([torch.ones(2)], os.path.join(d, "listed.pth"))
    torch.save({"w": torch.ones(2)}, os.path.join(d, "legacy.pth"), _use_new_zipfile_serialization=False)
    marker = os.path.join(d, "PWNED")
    cmd = f"touch {marker}".encode()
    # PROTO 2; GLOBAL os.system; SHORT_BINUNICODE cmd; TUPLE1; REDUCE; STOP
    zip_like_torch(os.path.join(d, "os_system.pth"), "os_system",
                   b"\x80\x02cos\nsystem\n\x8c" + bytes([len(cmd)]) + cmd + b"\x85R.")
    src = f"open('{marker}', 'w')".encode()
    # PROTO 4; SHORT_BINUNICODE builtins; SHORT_BINUNICODE eval; STACK_GLOBAL; SHORT_BINUNICODE src; TUPLE1; REDUCE
    zip_like_torch(os.path.join(d, "eval.pth"), "eval",
                   b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93\x8c" + bytes([len(src)]) + src + b"\x85R.")
    # PROTO 2; GLOBAL collections.OrderedDict; EMPTY_TUPLE; NEWOBJ; STOP
    zip_like_torch(os.path.join(d, "newobj.pth"), "newobj", b"\x80\x02ccollections\nOrderedDict\n)\x81.")


def check(pth, out):
    sd = torch.load(pth, map_location="cpu")
    if isinstance(sd, dict) and "model" in sd and not all(isinstance(v, torch.Tensor) for v in sd.values()):
        sd = sd["model"]
    got = ckpt.load(out)
    dtypes = {}
    with open(out + ".txt") as f:  # dpt-torch-file's listing, in the order dptrain read them: name dtype shape
        for line in f:
            name, dtype, _ = line.split(" ", 2)
            dtypes[name] = dtype
    if list(dtypes) != list(sd) or set(got) != set(sd):
        sys.exit(f"FAIL names or order differ: dptrain {list(dtypes)[:6]}..., torch.load {list(sd)[:6]}...")
    for name, t in sd.items():
        want_dtype, np_type = KEPT[t.dtype]
        if dtypes[name] != want_dtype:
            sys.exit(f"FAIL {name}: dptrain keeps it as {dtypes[name]}, expected {want_dtype} (torch: {t.dtype})")
        ref = t.detach()
        ref = ref.float() if t.dtype in (torch.float16, torch.bfloat16) else ref
        ref = ref.to(torch.int32) if t.dtype in (torch.int16, torch.int8) else ref
        ref = ref.to(torch.uint8) if t.dtype == torch.bool else ref
        ref = ref.contiguous().numpy().astype(np_type)
        mine = got[name]
        if mine.shape != ref.shape:
            sys.exit(f"FAIL {name}: shape {mine.shape}, torch.load {ref.shape}")
        if mine.tobytes() != ref.tobytes():
            sys.exit(f"FAIL {name}: values differ (max |a-b| {np.abs(mine.astype(np.float64) - ref).max()})")
    print(f"{os.path.basename(pth)}: {len(sd)} tensors equal to torch.load's, bit for bit, dtypes as kept")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "write":
        write(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
