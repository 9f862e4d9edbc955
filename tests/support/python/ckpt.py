"""tests/support/python/ckpt.py: reads dptrain checkpoints with numpy alone (the safetensors format is
8-byte little-endian header length, JSON header, raw bytes), so it is also the interop check that our
files are plain safetensors. Commands:
  ckpt.py compare DIR_A DIR_B ATOL          max |a-b| over model tensors; exit 1 if above ATOL
  ckpt.py differ DIR_A DIR_B MIN            exit 1 unless some tensor differs by more than MIN
  ckpt.py accuracy DIR DATA_DIR LIMIT       test accuracy of the checkpoint's MLP, computed in numpy
  ckpt.py compare_file A B ATOL             max |a-b| over the tensors of two safetensors files
  ckpt.py finite DIR                        exit 1 unless every model tensor is finite
  ckpt.py files_close FILE_A FILE_B ATOL [SKIP_REGEX]
                                            two safetensors files hold the same tensor names (those matching
                                            SKIP_REGEX left out of both) with max |a-b| <= ATOL; exit 1 if not
"""
import gzip
import json
import os
import re
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64, "U8": np.uint8}


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + hlen])
    body = data[8 + hlen :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        if info["dtype"] == "BF16":  # numpy has no bfloat16: its values, exactly, as float32
            bits = np.frombuffer(body[b:e], dtype=np.uint16).astype(np.uint32) << 16
            out[name] = bits.view(np.float32).reshape(info["shape"])
            continue
        out[name] = np.frombuffer(body[b:e], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def save(path, tensors):
    """Writes {name: numpy array} as safetensors (what PyTorch's safetensors.numpy.save_file writes)."""
    names = {v: k for k, v in DTYPES.items()}
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        b = a.tobytes()
        header[name] = {"dtype": names[a.dtype.type], "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def model_of(ckpt_dir):
    return load(os.path.join(ckpt_dir, "model.safetensors"))


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    return np.frombuffer(data[4 + 4 * ndim :], dtype=np.uint8).reshape(dims)


def accuracy(ckpt_dir, data_dir, limit):
    w = model_of(ckpt_dir)
    x = read_idx(os.path.join(data_dir, "t10k-images-idx3-ubyte.gz")).reshape(-1, 784)[:limit]
    y = read_idx(os.path.join(data_dir, "t10k-labels-idx1-ubyte.gz"))[:limit]
    h = (x.astype(np.float64) / 255.0 - 0.2860) / 0.3530
    layers = sorted({int(k.split(".")[1]) for k in w})
    for i, idx in enumerate(layers):
        h = h @ w[f"layers.{idx}.weight"].T.astype(np.float64) + w[f"layers.{idx}.bias"]
        if i + 1 < len(layers):
            h = np.maximum(h, 0)
    return float((h.argmax(axis=1) == y).mean())


def max_diff(a_dir, b_dir):
    return max_diff_of(model_of(a_dir), model_of(b_dir))


def max_diff_of(a, b):
    assert a.keys() == b.keys(), f"different tensors: {sorted(a)} vs {sorted(b)}"
    return max(float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in a)


def files_close(a_path, b_path, skip=None):
    """(tensor count, max |a-b|, the tensor where it is) over the tensors of both files whose names do not
    match `skip`; exits on a name or shape mismatch."""
    pattern = re.compile(skip) if skip else None

    def kept(path):
        return {k: v for k, v in load(path).items() if not (pattern and pattern.search(k))}

    a, b = kept(a_path), kept(b_path)
    if a.keys() != b.keys():
        sys.exit(f"FAIL different tensors: only in {a_path}: {sorted(a.keys() - b.keys())[:5]}, "
                 f"only in {b_path}: {sorted(b.keys() - a.keys())[:5]}")
    if not a:
        sys.exit("FAIL no tensors left to compare")
    worst, worst_name = 0.0, ""
    for k in a:
        if a[k].shape != b[k].shape:
            sys.exit(f"FAIL {k}: shape {a[k].shape} vs {b[k].shape}")
        d = float(np.abs(a[k].astype(np.float64) - b[k]).max()) if a[k].size else 0.0
        if d >= worst:
            worst, worst_name = d, k
    return len(a), worst, worst_name


def main():
    cmd = sys.argv[1]
    if cmd == "compare":
        d = max_diff(sys.argv[2], sys.argv[3])
        print(f"max |a-b| = {d:.3g} (tolerance {sys.argv[4]})")
        sys.exit(0 if d <= float(sys.argv[4]) else 1)
    if cmd == "differ":
        d = max_diff(sys.argv[2], sys.argv[3])
        print(f"max |a-b| = {d:.3g} (must exceed {sys.argv[4]})")
        sys.exit(0 if d > float(sys.argv[4]) else 1)
    if cmd == "files_close":
        skip = sys.argv[5] if len(sys.argv) > 5 else None
        n, d, name = files_close(sys.argv[2], sys.argv[3], skip)
        print(f"{n} tensors: max |a-b| = {d:.3g} ({name}; tolerance {sys.argv[4]})")
        sys.exit(0 if d <= float(sys.argv[4]) else 1)
    if cmd == "compare_file":
        d = max_diff_of(load(sys.argv[2]), load(sys.argv[3]))
        print(f"max |a-b| = {d:.3g} (tolerance {sys.argv[4]})")
        sys.exit(0 if d <= float(sys.argv[4]) else 1)
    if cmd == "finite":
        bad = [k for k, v in model_of(sys.argv[2]).items() if not np.isfinite(v.astype(np.float64)).all()]
        print(f"non-finite tensors: {bad}" if bad else "all finite")
        sys.exit(1 if bad else 0)
    if cmd == "accuracy":
        print(f"{accuracy(sys.argv[2], sys.argv[3], int(sys.argv[4])):.4f}")
        return
    sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
