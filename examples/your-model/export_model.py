#!/usr/bin/env python3
"""Your own model from PyTorch 2, for Conveyor: make_model.py's ConvNet as an nn.Module, exported.

    python3 export_model.py [OUT]      (PyTorch 2.5 or later: torch.export, torch.distributed.pipelining)

writes into OUT (default: this script's folder)

    model.pt2  the module, saved by torch.export.save after torch.export.export in training mode
               with its batch dimension dynamic,
               with a pipe_split() mark between its features and its classifier: where the job's
               two stages are cut (no TorchScript: the module need not script)
    train.pt, test.pt, and job.yaml: make_model.py's, the job naming model: {exported: model.pt2}
               (job-exported.yaml when OUT is this folder)

then `conveyor local OUT/job.yaml` trains it over 2 stage servers and writes OUT/trained.pt,
which `load_back.py OUT --exported` loads into ConvNet below with load_state_dict(strict=True).
Debian's python3-torch (1.13) has no torch.export: use a PyTorch 2 environment (pip's torch) for
this script and for load_back.py --exported; Conveyor's side needs no Python. Not run where the
project is tested (PyTorch 1.13 there); run on a GPU machine with PyTorch 2.11 by
`bench/gpu/exported.sh example` (4x H100, 2026-11-26, bench/RESULTS.md: the same test accuracy in
Conveyor and, loaded back, in PyTorch). The programs of tests/fixtures/pt2 were exported the same way with
PyTorch 2.11 and are tested against PyTorch's loop.
"""
import os
import sys

import torch
from torch import nn

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import make_model  # noqa: E402 (the data and the job of the TorchScript path)


class ConvNet(nn.Module):
    """make_model.py's ConvNet written as a module with a forward of its own."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)  # 8 x 14 x 14
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)             # 16 x 7 x 7
        split()  # stage 0 above, stage 1 below
        return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))    # logits


def split():
    """torch.distributed.pipelining's mark: a node of the exported graph, a no-op when the module
    runs eagerly."""
    from torch.distributed.pipelining import pipe_split
    pipe_split()


def export_with_dynamic_batch(model, example):
    """torch.export.export(model, (example,)) with the batch dimension dynamic: Conveyor runs the
    program on micro-batches and evaluation batches of any size, and a model that reads its batch
    size (x.view(x.size(0), -1)) would otherwise keep the example's in its graph. Dim's forms
    differ across PyTorch 2 releases: the first that exports."""
    errors = []
    for dim in (lambda: torch.export.Dim("batch", min=1, max=65536), lambda: torch.export.Dim.DYNAMIC,
                lambda: torch.export.Dim("batch", min=2, max=65536)):
        try:
            return torch.export.export(model, (example,), dynamic_shapes=({0: dim()},))
        except Exception as e:
            errors.append(repr(e)[:300])
    sys.exit("export_model.py: torch.export with a dynamic batch failed: " + "; ".join(errors))


def main():
    if not hasattr(torch, "export"):
        sys.exit(f"export_model.py: PyTorch {torch.__version__} has no torch.export (PyTorch 2 has)")
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else make_model.HERE)
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)  # the initial weights travel inside model.pt2
    model = ConvNet().train()  # training mode: BatchNorm updates its statistics, as Conveyor trains it
    program = export_with_dynamic_batch(model, torch.randn(8, 1, 28, 28))
    torch.export.save(program, os.path.join(out, "model.pt2"))
    torch.save(make_model.read_idx("train", make_model.TRAIN_SAMPLES), os.path.join(out, "train.pt"))
    torch.save(make_model.read_idx("t10k"), os.path.join(out, "test.pt"))
    job = open(os.path.join(make_model.HERE, "job.yaml")).read()
    job = job.replace("model: {torchscript: model.pt}           # torch.jit.script(nn.Sequential(...)).save(...)",
                      "model: {exported: model.pt2}             # torch.export.save(torch.export.export(...))")
    assert "exported: model.pt2" in job, "job.yaml's model line changed: update export_model.py"
    name = "job.yaml" if out != make_model.HERE else "job-exported.yaml"  # the example's own job stays
    with open(os.path.join(out, name), "w") as f:
        f.write(job.replace("name: your-model\n", "name: your-model-exported\n"))
    print(f"wrote model.pt2, train.pt, test.pt and {name} in {out}")


if __name__ == "__main__":
    main()
