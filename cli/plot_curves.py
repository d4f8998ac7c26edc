#!/usr/bin/env python3
"""Draws a job's training curves, as `conveyor plot` and `conveyor local` write
them (cli/curves.h: the CSV of `conveyor status --metrics-csv`), into one PNG:
training and evaluation loss, throughput, evaluation accuracy (or perplexity
for token jobs) and the learning rate, against steps.

usage: plot_curves.py CURVES.csv OUT.png [TITLE]
"""
import csv
import sys

try:
    import matplotlib
except ImportError:
    sys.exit(3)  # this python3 has none: cli/plot.cpp tries the next

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def number(row, key):
    value = row.get(key, "")
    return float(value) if value not in ("", None) else None


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    src, out = argv[1], argv[2]
    title = argv[3] if len(argv) > 3 else src
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    if not train:
        sys.exit(f"{src}: no training steps")
    steps = [int(r["step"]) for r in train]
    tokens = any(number(r, "tokens_per_second") is not None for r in train)

    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5))
    plural = lambda n, word: f"{n} {word}" + ("" if n == 1 else "s")  # noqa: E731
    fig.suptitle(f"{title}: {plural(len(train), 'step')}, {plural(len(evals), 'evaluation')}")

    ax = axes[0][0]
    ax.plot(steps, [number(r, "loss") for r in train], lw=0.8, color="tab:blue", label="training loss")
    if evals:
        ax.plot([int(r["step"]) for r in evals], [number(r, "loss") for r in evals], "o-", color="tab:red",
                label="evaluation loss")
    ax.set_title("loss")
    ax.set_xlabel("step")
    ax.legend()

    ax = axes[0][1]
    key, label = ("tokens_per_second", "tokens/s") if tokens else ("samples_per_second", "samples/s")
    ax.plot(steps, [number(r, key) for r in train], lw=0.8, color="tab:green")
    ax.set_title(f"throughput ({label}, each step's)")
    ax.set_xlabel("step")
    ax.set_ylim(bottom=0)

    ax = axes[1][0]
    eval_steps = [int(r["step"]) for r in evals]
    if tokens:
        ax.plot(eval_steps, [number(r, "eval_perplexity") for r in evals], "o-", color="tab:purple")
        ax.set_title("evaluation perplexity")
    else:
        ax.plot(eval_steps, [number(r, "eval_accuracy") for r in evals], "o-", color="tab:purple")
        ax.set_title("evaluation accuracy")
        ax.set_ylim(0, 1)
    if not evals:
        ax.text(0.5, 0.5, "no evaluation (eval: false)", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")

    ax = axes[1][1]
    ax.plot(steps, [number(r, "lr") for r in train], color="tab:orange", label="learning rate")
    ax.set_title("learning rate" + (" and gradient norm" if any(number(r, "grad_norm") is not None for r in train) else ""))
    ax.set_xlabel("step")
    norms = [(s, number(r, "grad_norm")) for s, r in zip(steps, train) if number(r, "grad_norm") is not None]
    if norms:
        twin = ax.twinx()
        twin.plot([s for s, _ in norms], [n for _, n in norms], lw=0.8, color="tab:gray", label="gradient norm")
        twin.set_ylabel("gradient norm")

    for row in axes:
        for ax in row:
            ax.set_xlim(0, max(steps) + 1)  # every panel on the same steps
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main(sys.argv)
