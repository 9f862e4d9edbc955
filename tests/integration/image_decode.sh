#!/usr/bin/env bash
# integration.image_decode: data/image_io.h's decoding against PIL's (Pillow 9.4, the test venv's), on files PIL
# and libjpeg write here (tests/tools/image_io.cpp, dpt-image-io, decodes them as the data sets do and writes the
# pixels as a PNG):
#  - CMYK JPEGs as PIL writes them (Adobe's inverted CMYK; baseline and progressive, odd sizes) and YCCK JPEGs as
#    Photoshop writes them (libjpeg's JCS_YCCK with an Adobe marker, transform 2: written by dpt-image-io, as PIL
#    cannot), read as RGB (data.channels = 3) and grey (1): every pixel equal to PIL's Image.convert("RGB") /
#    convert("L") (grey within 1 level on at most 0.5% of the pixels: see data/image_io.h on the "L" weights).
source "$(dirname "$0")/lib/common.bash"
PIL_PY=/opt/dptrain/test-venv/bin/python
TOOL=$DPT_BUILD_DIR/tests/dpt-image-io
"$PIL_PY" -c "import PIL, numpy" 2>/dev/null || fail "no $PIL_PY with PIL and numpy: run scripts/setup.sh --tests"

"$PIL_PY" - "$TOOL" "$WORK/cmyk" <<'PYEOF' || fail "CMYK and YCCK JPEGs decode unlike PIL's"
import os, subprocess, sys
import numpy as np
from PIL import Image
tool, d = sys.argv[1], sys.argv[2]
os.makedirs(d)
rng = np.random.default_rng(3)

def picture(h, w, c):  # smooth waves plus noise: every level of every channel, as a photograph has
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([127 + 120 * np.sin(rng.uniform(.02, .2) * x + rng.uniform(0, 6)) *
                    np.cos(rng.uniform(.02, .2) * y) for _ in range(c)], -1)
    return np.clip(img + rng.normal(0, 20, img.shape), 0, 255).astype(np.uint8)

files = []  # (path, Adobe transform PIL must report)
for i, (h, w) in enumerate([(37, 23), (64, 64), (9, 130)]):
    samples = picture(h, w, 4)
    f = f"{d}/cmyk{i}.jpg"
    Image.fromarray(samples, "CMYK").save(f, quality=90, progressive=i == 1)
    files.append((f, 0))
    samples.tofile(f"{d}/ycck{i}.raw")
    f = f"{d}/ycck{i}.jpg"
    subprocess.run([tool, "ycck", f"{d}/ycck{i}.raw", str(h), str(w), "90", f], check=True)
    files.append((f, 2))
bad = []
for f, transform in files:
    im = Image.open(f)
    assert im.mode == "CMYK" and im.info.get("adobe_transform") == transform, (f, im.mode, im.info)
    for channels, mode in ((3, "RGB"), (1, "L")):
        out = f"{f}.{channels}.png"
        subprocess.run([tool, "decode", f, str(channels), out], check=True, stdout=subprocess.DEVNULL)
        ours = np.asarray(Image.open(out)).astype(int)
        theirs = np.asarray(Image.open(f).convert(mode)).astype(int)
        assert ours.shape == theirs.shape, (f, mode, ours.shape, theirs.shape)
        diff = np.abs(ours - theirs)
        off = int((diff > 0).sum())
        print(f"{os.path.basename(f)} as {mode}: {off} of {diff.size} values differ, by at most {diff.max()}")
        if mode == "RGB" and off or diff.max() > 1 or off > 0.005 * diff.size:
            bad.append(f"{f} as {mode}")
sys.exit(f"unlike PIL: {bad}" if bad else 0)
PYEOF
echo "PASS: CMYK and YCCK JPEGs decode as PIL decodes them, as RGB and as grey"
