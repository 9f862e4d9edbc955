#!/usr/bin/env python3
"""make_jpeg_folder.py ROOT N: an image folder of JPEGs for the loader benchmark: ROOT/train/<a_cats|b_dogs>/ with N
images each and ROOT/val/ with 4 each, 500x375 RGB (ImageNet's typical size), smooth waves plus noise (about 70 KB
each at quality 90, so decoding costs what a photograph's does), the same bytes every time (seeded)."""
import numpy as np, os, sys
from PIL import Image
root, n = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
for split, count in (("train", n), ("val", 4)):
    for c in ("a_cats", "b_dogs"):
        d = os.path.join(root, split, c); os.makedirs(d, exist_ok=True)
        for i in range(count):
            h, w = 375, 500
            y, x = np.mgrid[0:h, 0:w]
            f = rng.uniform(0.005, 0.03, size=3); p = rng.uniform(0, 6.3, size=3)
            img = np.stack([127 + 100 * np.sin(f[k] * x + p[k]) * np.cos(f[(k + 1) % 3] * y) for k in range(3)], -1)
            img += rng.normal(0, 12, size=img.shape)
            Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(os.path.join(d, f"{i:05d}.jpg"), quality=90)
