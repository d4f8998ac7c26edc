#!/usr/bin/python3
"""Your own model, for Conveyor: a small ConvNet on Fashion-MNIST.

    /usr/bin/python3 make_model.py [OUT]

writes into OUT (default: this script's folder)

    model.pt   the model, an nn.Sequential scripted with torch.jit.script
    train.pt   {"inputs": float32 N x 1 x 28 x 28 in [0, 1], "targets": int64 N}
    test.pt    the same for the test split
    job.yaml   a copy of the job next to them (its paths are relative to its folder)

then `conveyor local OUT/job.yaml` trains it over 2 stage servers and writes
OUT/trained.pt, which load_back.py reads. Needs PyTorch (Debian's python3-torch)
and the Fashion-MNIST files (Debian's dataset-fashion-mnist).
"""
import gzip
import os
import shutil
import sys

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
FASHION = "/usr/share/datasets/fashion-mnist"
TRAIN_SAMPLES = 20000  # the job's 300 steps of 64 see about 19,200


def build_model():
    """The model. Its top-level children are the layers Conveyor cuts between."""
    torch.manual_seed(0)  # the initial weights travel inside model.pt
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),   # 8 x 14 x 14
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),                    # 16 x 7 x 7
        nn.Flatten(),
        nn.Linear(16 * 7 * 7, 64), nn.ReLU(),
        nn.Linear(64, 10))                                                             # logits


def read_idx(split, limit=None):
    """Fashion-MNIST's gzipped IDX files as (float32 N x 1 x 28 x 28 in [0, 1], int64 N)."""
    with gzip.open(f"{FASHION}/{split}-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(f"{FASHION}/{split}-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(images.astype(np.float32) / 255.0)
    y = torch.from_numpy(labels.astype(np.int64))
    return {"inputs": x, "targets": y}


def main():
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else HERE)
    os.makedirs(out, exist_ok=True)
    torch.jit.script(build_model()).save(os.path.join(out, "model.pt"))
    torch.save(read_idx("train", TRAIN_SAMPLES), os.path.join(out, "train.pt"))
    torch.save(read_idx("t10k"), os.path.join(out, "test.pt"))
    if out != HERE:
        shutil.copy(os.path.join(HERE, "job.yaml"), os.path.join(out, "job.yaml"))
    print(f"wrote model.pt, train.pt, test.pt and job.yaml in {out}")


if __name__ == "__main__":
    main()
