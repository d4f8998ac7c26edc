#!/usr/bin/python3
"""Loads the weights Conveyor trained back into the PyTorch model and tests them.

    /usr/bin/python3 load_back.py [DIR]
    python3 load_back.py DIR --exported      (PyTorch 2: export_model.py's module)

DIR (default: this script's folder) holds trained.pt (the job's save.path) and
test.pt, as make_model.py (or export_model.py) and `conveyor local DIR/job.yaml` left them.
"""
import os
import sys

import torch

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from make_model import HERE, build_model  # noqa: E402 (the same model as make_model.py)


def main():
    args = [a for a in sys.argv[1:] if a != "--exported"]
    folder = os.path.abspath(args[0] if args else HERE)
    if "--exported" in sys.argv[1:]:
        from export_model import ConvNet  # the module model.pt2 was exported from
        model = ConvNet()
    else:
        model = build_model()
    state = torch.load(os.path.join(folder, "trained.pt"), weights_only=True)  # no pickle code runs
    model.load_state_dict(state, strict=True)  # every parameter and buffer, by name
    model.eval()  # BatchNorm uses the running statistics trained by Conveyor
    test = torch.load(os.path.join(folder, "test.pt"), weights_only=True)
    with torch.no_grad():
        predicted = model(test["inputs"]).argmax(1)
    accuracy = (predicted == test["targets"]).float().mean().item()
    print(f"loaded {len(state)} tensors from {folder}/trained.pt; "
          f"test accuracy in PyTorch: {100 * accuracy:.2f}% of {len(predicted)}")


if __name__ == "__main__":
    main()
