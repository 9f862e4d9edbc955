#!/usr/bin/env python3
"""tests/fuzz/make_corpus.py: writes the fuzz targets' seed inputs under tests/fuzz/corpus/<target>/ (the
committed seeds are its output; rerun it after changing a format). Tiny valid inputs: libFuzzer mutates
from there."""
import gzip
import json
import os
import struct
import zlib

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    os.makedirs(os.path.join(HERE, target), exist_ok=True)
    with open(os.path.join(HERE, target, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# IDX: 0x00 0x00 0x08 ndim, big-endian dims, the bytes. Labels (1-D), images (3-D), and a gzip one.
put("idx", "labels", bytes([0, 0, 8, 1]) + struct.pack(">I", 4) + bytes([0, 1, 2, 9]))
images = bytes([0, 0, 8, 3]) + struct.pack(">III", 2, 3, 2) + bytes(range(12))
put("idx", "images", images)
put("idx", "images.gz", gzip.compress(images, mtime=0))

# Store requests, host byte order (little-endian here): u8 cmd; strings u32 len; values u64 len.
def s(b):
    return struct.pack("<I", len(b)) + b

SET, GET, ADD, WAIT = 1, 2, 3, 4
# Each connection starts with a hello: u32 magic, the rendezvous token (fuzz_store.cpp's kToken) as a string.
HELLO = struct.pack("<I", 0x01545044) + s(b"0123456789abcdef0123456789abcdef")
put("store", "hello_only", HELLO)
put("store", "hello_wrong_token", struct.pack("<I", 0x01545044) + s(b"not the token") + bytes([GET]) + s(b"k"))
put("store", "set_get", HELLO + bytes([SET]) + s(b"rank0/addr") + struct.pack("<Q", 5) + b"hello" + bytes([GET]) + s(b"rank0/addr"))
put("store", "add_add", HELLO + bytes([ADD]) + s(b"count") + struct.pack("<q", 1) + bytes([ADD]) + s(b"count") + struct.pack("<q", -3))
put("store", "set_add", HELLO + bytes([SET]) + s(b"n") + struct.pack("<Q", 2) + b"41" + bytes([ADD]) + s(b"n") + struct.pack("<q", 1))
put("store", "wait", HELLO + bytes([WAIT]) + struct.pack("<q", 1000) + struct.pack("<I", 2) + s(b"a") + s(b"b"))

# Config TOML: a small valid experiment, and one with overrides after a NUL byte.
cfg = """[train]
epochs = 2
batch_size = 32
lr = 0.1
optimizer = "adamw"

[model]
name = "mlp"
hidden = [64, 32]

[data]
dataset = "synthetic"
synthetic_shape = [1, 28, 28]
"""
put("config", "mlp.toml", cfg)
put("config", "overrides", cfg + "\0train.lr=0.5\nmodel.hidden=[8]\ndist.backend=gloo")
put("config", "gpt.toml", 'model.name = "gpt"\nmodel.n_layer = 2\ndata.dataset = "tokens"\ntrain.warmup_steps = 10\n')


# safetensors: u64 LE header length, JSON header (dtype, shape, data_offsets; __metadata__ with our CRCs), bytes.
def safetensors(tensors, crc=True):
    header, blob, meta = {}, b"", {}
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        if crc:
            meta["crc32:" + name] = "%08x" % zlib.crc32(data)
        blob += data
    header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + blob


put("safetensors", "two", safetensors([("w", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
                                       ("step", "I64", [], struct.pack("<q", 7))]))
put("safetensors", "nocrc", safetensors([("b", "BF16", [3], b"\x80\x3f\x00\x40\x40\x40"),
                                         ("u", "U8", [0], b"")], crc=False))
put("safetensors", "f16", safetensors([("h", "F16", [2, 2], struct.pack("<4H", 0x3C00, 0xC100, 0x7BFF, 0x0001))]))
# An empty tensor at the offset where another's bytes begin, as safetensors' writer puts an empty F32 before BF16.
put("safetensors", "empty_at_offset", safetensors([("z", "F32", [0], b""), ("a", "BF16", [2], b"\x80\x3f\x00\x40")]))


# torch.save's format (trainer/torch_file.h): data.pkl, a protocol-2 pickle of an OrderedDict whose tensors are
# torch._utils._rebuild_tensor_v2 of persistent ids ('storage', torch.FloatStorage, KEY, 'cpu', NUMEL), in a zip
# (stored, as torch.save writes) beside ARCHIVE/data/KEY. Written opcode by opcode, as the pickler would.
def pkl_str(s):
    return b"\x8c" + bytes([len(s)]) + s.encode()


def pkl_int(v):
    return b"K" + bytes([v]) if 0 <= v < 256 else b"J" + struct.pack("<i", v)


def pkl_tensor(key, storage, numel, offset, size, stride, memo):
    out = b"ctorch._utils\n_rebuild_tensor_v2\nq" + bytes([memo]) + b"("
    out += b"(" + pkl_str("storage") + b"ctorch\n" + storage.encode() + b"\n" + pkl_str(key) + pkl_str("cpu")
    out += pkl_int(numel) + b"tQ" + pkl_int(offset)
    out += b"(" + b"".join(pkl_int(s) for s in size) + b"t(" + b"".join(pkl_int(s) for s in stride) + b"t"
    out += b"\x89ccollections\nOrderedDict\n)RtR"
    return out


state_pkl = (b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01("
             + pkl_str("w") + pkl_tensor("0", "FloatStorage", 6, 0, [2, 3], [3, 1], 2)
             + pkl_str("wT") + pkl_tensor("0", "FloatStorage", 6, 0, [3, 2], [1, 3], 3)
             + pkl_str("h") + pkl_tensor("1", "HalfStorage", 4, 1, [3], [1], 4)
             + pkl_str("n") + pkl_tensor("2", "LongStorage", 1, 0, [], [], 5)
             + b"u}(X\x09\x00\x00\x00_metadata}ub.")  # BUILD: the OrderedDict's _metadata attribute


def torch_zip(pkl, storages):
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")
        for key, data in storages.items():
            zi = zipfile.ZipInfo(f"archive/data/{key}", date_time=(1980, 1, 1, 0, 0, 0))
            z.writestr(zi, data)
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


put("torch_file", "state_dict.pkl", state_pkl)
put("torch_file", "state_dict.pth", torch_zip(state_pkl, {"0": struct.pack("<6f", 1, 2, 3, 4, 5, 6),
                                                          "1": struct.pack("<4e", 1, -2, 0.5, 65504),
                                                          "2": struct.pack("<q", 7)}))
put("torch_file", "training.pkl", b"\x80\x02}(" + pkl_str("epoch") + pkl_int(3) + pkl_str("model") + b"}("
    + pkl_str("b") + pkl_tensor("3", "BFloat16Storage", 4, 0, [2, 2], [2, 1], 0) + b"uu.")
put("torch_file", "os_system.pkl", b"\x80\x02cos\nsystem\n" + pkl_str("true") + b"\x85R.")
