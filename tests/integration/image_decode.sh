#!/usr/bin/env bash
# integration.image_decode: data/image_io.h's decoding against PIL's (Pillow 9.4, the test venv's), on files PIL
# and libjpeg write here (tests/tools/image_io.cpp, dpt-image-io, decodes them as the data sets do and writes the
# pixels as a PNG). Each file is read as RGB (data.channels = 3) and grey (1) and compared with PIL's
# Image.convert("RGB") / convert("L"), every pixel equal:
#  - all 2^24 colours in one RGB PNG (PIL's fixed-point "L" weights), 8-bit grey, grey + alpha, RGBA and palette
#    PNGs;
#  - colour JPEGs (4:4:4, 4:2:0, progressive; as grey: decoded to RGB, then PIL's "L") and a grey JPEG;
#  - CMYK JPEGs as PIL writes them (Adobe's inverted CMYK; baseline and progressive, odd sizes) and YCCK JPEGs as
#    Photoshop writes them (libjpeg's JCS_YCCK with an Adobe marker, transform 2: written by dpt-image-io, as PIL
#    cannot);
#  - 16-bit PNGs, where dptrain and PIL differ as data/image_io.h says: dptrain rounds v * 255 / 65535, PIL keeps
#    the high byte of colour (within one level) and saturates grey at 255.
source "$(dirname "$0")/lib/common.bash"
PIL_PY=/opt/dptrain/test-venv/bin/python
TOOL=$DPT_BUILD_DIR/tests/dpt-image-io
"$PIL_PY" -c "import PIL, numpy" 2>/dev/null || fail "no $PIL_PY with PIL and numpy: run scripts/setup.sh --tests"

"$PIL_PY" - "$TOOL" "$WORK/img" <<'PYEOF' || fail "dptrain's pixels are not PIL's"
import os, struct, subprocess, sys, zlib
import numpy as np
from PIL import Image
tool, d = sys.argv[1], sys.argv[2]
os.makedirs(d)
rng = np.random.default_rng(3)
bad = []

def picture(h, w, c):  # smooth waves plus noise, clipping here and there, as photographs do
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([127 + 120 * np.sin(rng.uniform(.02, .2) * x + rng.uniform(0, 6)) *
                    np.cos(rng.uniform(.02, .2) * y) for _ in range(c)], -1)
    return np.clip(img + rng.normal(0, 20, img.shape), 0, 255).astype(np.uint8)

def ours(f, channels):
    out = f"{f}.{channels}.png"
    subprocess.run([tool, "decode", f, str(channels), out], check=True, stdout=subprocess.DEVNULL)
    return np.asarray(Image.open(out)).astype(np.int64)

def same_as_pil(f):
    for channels, mode in ((3, "RGB"), (1, "L")):
        a, b = ours(f, channels), np.asarray(Image.open(f).convert(mode)).astype(np.int64)
        off = int((a != b).sum()) if a.shape == b.shape else -1
        print(f"{os.path.basename(f)} ({Image.open(f).mode}) as {mode}: {off} of {b.size} values differ")
        if off != 0:
            bad.append(f"{os.path.basename(f)} as {mode}")

# Every colour once (4096 x 4096), then the other 8-bit PNG kinds.
v = np.arange(1 << 24, dtype=np.uint32)
every = np.stack([(v >> 16) & 255, (v >> 8) & 255, v & 255], -1).astype(np.uint8).reshape(4096, 4096, 3)
Image.fromarray(every).save(f"{d}/every_colour.png", compress_level=1)
same_as_pil(f"{d}/every_colour.png")
rgba = picture(20, 30, 4)
Image.fromarray(rgba, "RGBA").save(f"{d}/rgba.png")
Image.fromarray(rgba[..., :2], "LA").save(f"{d}/la.png")
Image.fromarray(rgba[..., 0], "L").save(f"{d}/grey.png")
Image.fromarray(rgba[..., :3]).quantize(64).save(f"{d}/palette.png")
for f in ("rgba", "la", "grey", "palette"):
    same_as_pil(f"{d}/{f}.png")

# Colour and grey JPEGs.
rgb = picture(75, 101, 3)
for name, kw in (("444", dict(subsampling=0)), ("420", dict(subsampling=2)),
                 ("420_progressive", dict(subsampling=2, progressive=True))):
    Image.fromarray(rgb).save(f"{d}/colour_{name}.jpg", quality=85, **kw)
    same_as_pil(f"{d}/colour_{name}.jpg")
Image.fromarray(rgb[..., 1]).save(f"{d}/grey.jpg", quality=85)
same_as_pil(f"{d}/grey.jpg")

# CMYK (PIL writes Adobe's inverted CMYK) and YCCK (dpt-image-io: libjpeg's JCS_YCCK).
for i, (h, w) in enumerate([(37, 23), (64, 64), (9, 130)]):
    samples = picture(h, w, 4)
    Image.fromarray(samples, "CMYK").save(f"{d}/cmyk{i}.jpg", quality=90, progressive=i == 1)
    samples.tofile(f"{d}/ycck{i}.raw")
    subprocess.run([tool, "ycck", f"{d}/ycck{i}.raw", str(h), str(w), "90", f"{d}/ycck{i}.jpg"], check=True)
    for f, transform in ((f"{d}/cmyk{i}.jpg", 0), (f"{d}/ycck{i}.jpg", 2)):
        im = Image.open(f)
        assert im.mode == "CMYK" and im.info.get("adobe_transform") == transform, (f, im.mode, im.info)
        same_as_pil(f)

# 16-bit PNGs (written here: PIL cannot write 16-bit colour): the documented difference, held to its word.
def png16(path, samples, color_type):
    h, w = samples.shape[:2]
    raw = b"".join(b"\0" + samples[y].astype(">u2").tobytes() for y in range(h))
    chunk = lambda t, data: struct.pack(">I", len(data)) + t + data + struct.pack(">I", zlib.crc32(t + data))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
v16 = np.concatenate([np.arange(0, 65536, 97), [255, 256, 65280, 65535]]).astype(np.int64)
png16(f"{d}/rgb16.png", np.stack([v16, v16[::-1], v16], -1)[None], 2)
png16(f"{d}/grey16.png", v16[None], 0)
scaled = (v16 * 255 + 32767) // 65535  # libpng's png_set_scale_16
rgb16, grey16 = ours(f"{d}/rgb16.png", 3)[0], ours(f"{d}/grey16.png", 1)[0]
pil_rgb16 = np.asarray(Image.open(f"{d}/rgb16.png").convert("RGB")).astype(np.int64)[0]
pil_grey16 = np.asarray(Image.open(f"{d}/grey16.png").convert("L")).astype(np.int64)[0]
checks = {"dptrain rounds 16-bit colour": (rgb16[:, 0] == scaled).all(),
          "dptrain rounds 16-bit grey": (grey16 == scaled).all(),
          "PIL keeps the high byte of 16-bit colour": (pil_rgb16[:, 0] == v16 >> 8).all(),
          "within one level": np.abs(rgb16 - pil_rgb16).max() == 1,
          "PIL saturates 16-bit grey": (pil_grey16 == np.minimum(v16, 255)).all()}
print("16-bit PNGs:", checks)
bad += [k for k, ok in checks.items() if not ok]
sys.exit(f"unlike PIL (or unlike data/image_io.h says): {bad}" if bad else 0)
PYEOF
echo "PASS: dptrain decodes as PIL: every colour as grey, PNGs, colour, grey, CMYK and YCCK JPEGs; 16-bit as documented"
