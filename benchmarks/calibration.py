"""Calibration images for the MCU networks (../shared/models/tte), made from data nobody here
made: random 128x128 crops of scikit-learn's two bundled photographs (load_sample_images:
a temple in China and a flower), each at a random scale (the crop covers 20% to 100% of the
shorter side), flipped left-right half the time, resized by area averaging, and scaled as
MIT's models expect, x = pixel / 127.5 - 1 (their README). Seeded: the same samples every run.

    python benchmarks/calibration.py -o calib.npz [--n 64] [--size 128]
"""
import argparse
import sys

import numpy as np

# uint8 pixels p as MIT's models take them: x = (p - 128) / 127.5, about p / 127.5 - 1
INPUT_QUANT = (1 / 127.5, 128)


def samples(n=64, size=128, seed=0):
    from sklearn.datasets import load_sample_images
    photos = [np.asarray(p, np.float32) for p in load_sample_images().images]
    rng = np.random.default_rng(seed)
    out = np.empty((n, 3, size, size), np.float32)
    for k in range(n):
        img = photos[k % len(photos)]
        h, w, _ = img.shape
        side = max(size, int(rng.uniform(0.2, 1.0) * min(h, w)))   # never upsampled
        y0, x0 = rng.integers(0, h - side + 1), rng.integers(0, w - side + 1)
        crop = img[y0:y0 + side, x0:x0 + side]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        # area resize: average the pixels that fall in each output cell
        edges = np.linspace(0, side, size + 1).astype(int)
        rows = np.add.reduceat(crop, edges[:-1], axis=0) / np.diff(edges)[:, None, None]
        cells = np.add.reduceat(rows, edges[:-1], axis=1) / np.diff(edges)[None, :, None]
        out[k] = (cells / 127.5 - 1.0).transpose(2, 0, 1)
    return out


def int8_options(calib, pixels="uint8"):
    """microtrain.compile's arguments for an MCU network's frozen part in int8 (post-training
    min/max calibration on `calib`) taking uint8 pixels, as benchmarks/tte.py and bench.py use them;
    pixels="int8": int8 pixels (pixel - 128, MIT's int8 input), which a plan can read in place
    (compile(input_in_place=True)), where a uint8 input is flipped to int8 in a copy."""
    if pixels not in ("uint8", "int8"):
        raise ValueError("pixels must be 'uint8' or 'int8', not %r" % (pixels,))
    scale, zero = INPUT_QUANT
    return dict(quantize="int8", calibration=calib, input_dtype=pixels,
                input_quant=(scale, zero) if pixels == "uint8" else (scale, zero - 128))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--size", type=int, default=128)
    a = ap.parse_args()
    np.savez(a.output, x=samples(a.n, a.size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
