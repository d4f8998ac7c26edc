"""Files a job must refuse (`oracle.py bad DIR`, which says what each one is),
made from oracle.py's mlp and data."""
import os

import torch
from torch import nn

from oracle import build, make_data


class NotSequential(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


def bad(folder):
    os.makedirs(folder, exist_ok=True)
    model, _ = build("mlp")
    torch.save(model.state_dict(), f"{folder}/notscript.pt")
    torch.jit.script(NotSequential()).save(f"{folder}/module.pt")
    torch.save({"inputs": torch.randn(10, 1, 8, 8), "targets": torch.randint(0, 10, (9,))}, f"{folder}/uneven.pt")
    wide = model.state_dict()
    wide["1.weight"] = torch.zeros(33, 64)
    torch.save(wide, f"{folder}/wide.pt")
    extra = model.state_dict()
    extra["9.weight"] = torch.zeros(1)
    torch.save(extra, f"{folder}/extra.pt")
    with open(f"{folder}/odd.bin", "wb") as f:
        f.write(bytes(47))
    nan = make_data("images", 96, 1)
    nan["inputs"][37, 0, 3, 3] = float("nan")  # sample 37: the third batch of 16 in file order
    torch.save(nan, f"{folder}/nan.pt")
