#!/usr/bin/env python3
"""W2's decoder written in Python, scripted, and trained by Conveyor, beside the zoo's gpt.

Builds the 1.34 B-parameter GPT decoder of W2 (../shared/BENCHMARKS.md) as an
nn.Sequential of torch.nn modules (token + position embedding, 24 pre-norm
blocks with causal scaled-dot-product attention and a GELU MLP, final norm and
output layer; bench/torch_pipelining.py's model, made scriptable), saves it
with torch.jit.script in bf16, writes a file of random uint16 token ids, and
times, one after the other (--variants picks some):

  pytorch-eager    the scripted module's eager original in a plain PyTorch loop, on --device,
                   on the token file's batches in order (those torchscript-gpt trains on)
  zoo-gpt          `conveyor train --reference` of examples/gpt-w2.yaml (the zoo's gpt), on --device
  torchscript-gpt  the same, with model: {torchscript: w2.pt} and data: {format: tokens}
  zoo-gpt-2stage   zoo-gpt through `conveyor local`: partition: {boundaries: [K]} (2 stages),
                   schedule 1f1b, 8 micro-batches (--schedule, --micro-batches); conveyor local
                   starts one stage server per stage, each on its own GPU
  torchscript-gpt-2stage  torchscript-gpt the same way
  exported-gpt     the same module exported instead (PyTorch 2: torch.export in training mode, the
                   batch dynamic), model: {exported: w2.pt2}: Conveyor interprets the program
  exported-gpt-unfused  exported-gpt with model.fused false: attention's head split (view, permute,
                   unbind) run as its three nodes instead of one SplitHeads (what the fusion saves)
  exported-gpt-2stage  exported-gpt through `conveyor local`, cut by model.cut_before at the
                   Sequential's child K (the 2-stage boundary), so its two layers are the others' two
                   stages (issue 35's speed goal: within 3% of zoo-gpt and zoo-gpt-2stage)

all bf16, SGD (lr 0.001), batch 32 x 1024 tokens, and prints a table (ms per
step after the warm-up steps, final loss), how far apart the final losses are,
and a CSV. With --outside-steps N each Conveyor row is checked from outside
(bench.py's outside clock): its job run again N steps longer, the difference of
the two runs' wall times over N beside the row's own figure, a row more than 5%
off marked. The 2-stage variants need two GPUs (or --device cpu: two CPU stage
servers); with fewer, the default leaves them out and says so.

The cut. The zoo's gpt has B + 3 layers (embedding, B blocks, final LayerNorm,
output Linear: model/models.cpp); the scripted Sequential has B + 2 children
(embedding, B blocks, Head = final LayerNorm + output Linear). Layer i is the
same module in both for i = 0 .. B, so a boundary K in 1 .. B + 1 cuts both at
the same place: stage 0 holds the embedding and blocks 0 .. K-2, stage 1 the
rest. Both 2-stage variants get the same explicit `partition.boundaries`
(default K = B // 2 + 2: for W2 14, the cut `balance: time` chose for the zoo's
W2 on the H200s, [0, 14) | [14, 27): the output layer costs about 1.3 blocks).
`partition: {stages: 2}` alone (balance: layers) starts stage 1 at layer
L // 2 of L layers (plan/model_catalog.cpp): 27 // 2 = 13 for the zoo and
26 // 2 = 13 for the script, the same place for an even B but not for an odd
one (B = 23: 13 against 12), and one block short of the balanced cut.
--balance layers|params|time lets each variant cut itself instead (then the
cuts may differ; the output says where each one fell).

Small shapes for a CPU check, e.g.:
  bench/torchscript_w2.py --device cpu --blocks 2 --width 64 --heads 2 --mlp-width 128 \\
      --vocab 256 --seq-len 32 --batch 8 --steps 4

usage: bench/torchscript_w2.py [--bin build/bin] [--out DIR] [--steps 8] [--device cuda:0] [--blocks 24]
                               [--variants LIST] [--schedule 1f1b] [--micro-batches 8]
                               [--boundary K | --balance layers|params|time]
                               [--vocab V] [--width W] [--heads H] [--mlp-width M] [--seq-len T] [--batch B]
                               [--outside-steps N] [--outside-repeats R] [--outside-variants LIST]
"""
import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_outside  # noqa: E402
V, W, H, M, T = 32000, 2048, 16, 8192, 1024
BATCH = 32
WARMUP = 2  # Conveyor's steady rate leaves out the first 2 steps (common/job_spec.h kWarmupSteps)

ONE_DEVICE = ("pytorch-eager", "zoo-gpt", "torchscript-gpt", "exported-gpt", "exported-gpt-unfused")
TWO_STAGE = ("zoo-gpt-2stage", "torchscript-gpt-2stage", "exported-gpt-2stage")
EXPORTED = ("exported-gpt", "exported-gpt-unfused", "exported-gpt-2stage")
VARIANTS = ONE_DEVICE + TWO_STAGE


def build(blocks, dtype="bfloat16"):
    """W2's decoder with `blocks` blocks, its parameters in `dtype` (a torch dtype's name)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    if hasattr(F, "scaled_dot_product_attention"):
        def attend(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:  # PyTorch before 2.0 (Debian's 1.13, for the CPU check): the same causal attention, unfused
        def attend(q, k, v):
            t = q.shape[2]
            s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / float(q.shape[3]) ** 0.5)
            mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
            return torch.matmul(torch.softmax(s.masked_fill(mask, float("-inf")), -1), v)

    class Embedding(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(V, W)
            self.pos = nn.Embedding(T, W)

        def forward(self, x):
            return self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1 = nn.LayerNorm(W)
            self.qkv = nn.Linear(W, 3 * W)
            self.proj = nn.Linear(W, W)
            self.n2 = nn.LayerNorm(W)
            self.fc1 = nn.Linear(W, M)
            self.fc2 = nn.Linear(M, W)
            self.heads = H  # an attribute: TorchScript does not read Python globals

        def forward(self, x):
            b, t, w = x.shape[0], x.shape[1], x.shape[2]
            qkv = self.qkv(self.n1(x)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
            a = attend(qkv[0], qkv[1], qkv[2])
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, w))
            return x + self.fc2(F.gelu(self.fc1(self.n2(x))))

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(W)
            self.out = nn.Linear(W, V)

        def forward(self, x):
            return self.out(self.norm(x))

    torch.manual_seed(0)
    return nn.Sequential(Embedding(), *[Block() for _ in range(blocks)], Head()).to(getattr(torch, dtype))


def export_program(model, tokens, path):
    """PyTorch 2: `model` exported in training mode on a batch of 4 with the batch dynamic, saved to
    `path`; None, or why not."""
    import numpy as np
    import torch
    if not hasattr(torch, "export"):
        return "needs PyTorch 2 (torch.export); this is %s" % torch.__version__
    example = torch.from_numpy(tokens[:4 * T].astype(np.int64)).view(4, T)
    errors = []
    for name, dim in [("Dim('batch', min=1)", lambda: torch.export.Dim("batch", min=1, max=4096)),
                      ("Dim.DYNAMIC", lambda: torch.export.Dim.DYNAMIC),
                      ("Dim('batch', min=2)", lambda: torch.export.Dim("batch", min=2, max=4096))]:
        try:
            program = torch.export.export(model.train(), (example,), dynamic_shapes=({0: dim()},))
        except Exception as e:  # the Dim forms differ across 2.x releases
            errors.append("%s: %s" % (name, repr(e)[:300]))
            continue
        torch.export.save(program, path)
        print("exported with %s to %s" % (name, path), file=sys.stderr)
        return None
    return "torch.export failed: " + "; ".join(errors)


def job(path, lines):
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def count_gpus(args):
    """CUDA devices `conveyor local` would use: what its stage server counts (as the CLI asks it),
    else what torch sees."""
    try:
        proc = subprocess.run([os.path.join(args.bin, "stage_server"), "--count-gpus"], capture_output=True,
                              text=True, timeout=120)
        if proc.returncode == 0:
            return int(proc.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        pass
    import torch
    return torch.cuda.device_count()


def children_of(pid):
    """The pids of a process's children (its stage servers and coordinator, for `conveyor local`)."""
    out = []
    try:
        for task in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, task)) as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def run_command(cmd, timeout):
    """Runs cmd; past `timeout` s stops it (SIGTERM: conveyor cancels the job and stops its
    cluster), then kills it and the children it had started that are still there.
    Returns (returncode or None on timeout, stdout, stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        kids = children_of(proc.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        for k in kids:  # a stage server stuck on its device would hold it through the next variant
            try:
                os.kill(k, signal.SIGKILL)
            except OSError:
                pass
        return None, out, (err or "") + "\n[torchscript_w2.py: stopped after %d s]\n" % timeout


def run_conveyor(args, name, job_path, steps=None):
    """One Conveyor variant's run: its row (ms per step, losses, stages, the process's wall time in
    wall_s), or {"variant", "error"}. `steps` overrides the job's (the outside clock's longer run,
    logged as NAME-STEPS)."""
    exe = os.path.join(args.bin, "conveyor")
    if name in TWO_STAGE:
        # One stage server per stage, on cuda:0 and cuda:1 (conveyor local: stage i on GPU i % GPUs; --stages 2
        # keeps two servers on a one-GPU host, where they would be folded into one), or on the CPU with
        # --device cpu; no curves PNG.
        cmd = [exe, "local", job_path, "--device", "cpu" if args.device == "cpu" else "cuda", "--json",
               "--curves", "", "--stages", "2"]
    else:
        cmd = [exe, "train", job_path, "--reference", "--device", args.device, "--json"]
    base = name
    if steps is not None:
        cmd += ["--set", "steps=%d" % steps]
        base = "%s-%d" % (name, steps)
    log = os.path.join(args.out, base + ".log")
    print("running %s: %s" % (base, " ".join(c if c else '""' for c in cmd)), file=sys.stderr, flush=True)
    started = time.perf_counter()
    try:
        rc, stdout, stderr = run_command(cmd, args.timeout)
    except OSError as e:
        return {"variant": name, "error": "cannot run %s: %s" % (exe, e)}
    wall = time.perf_counter() - started
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n" + stderr)
    if rc is None:
        return {"variant": name, "error": "past %d s, stopped; see %s" % (args.timeout, log)}
    r = None
    try:
        r = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else None
    except ValueError:
        pass
    if r is not None:
        with open(os.path.join(args.out, base + ".json"), "w") as f:
            json.dump(r, f, indent=1)
    row = {"variant": name, "wall_s": round(wall, 2)}
    if rc != 0:
        # A job can succeed and print its result before the CLI dies on the way out: keep its figures.
        if not r or r.get("state") != "succeeded":
            return {"variant": name, "error": "exit %d, see %s" % (rc, log)}
        row["note"] = "conveyor exited %d after the job succeeded" % rc
    sps = r.get("steady_samples_per_second")
    if not sps:
        return {"variant": name, "error": "no steady rate in its output, see %s" % log}
    losses = [float(x) for x in r.get("losses") or []]
    row.update(ms_per_step=round(1000.0 * BATCH / sps, 1), final_loss=r.get("final_loss"), losses=losses)
    stages = r.get("stages") or []
    if name in TWO_STAGE:
        row["stages"] = " | ".join("[%d, %d) on %s" % (s["layers"][0], s["layers"][1], s.get("device", "?"))
                                   for s in stages)
        row["boundaries"] = [s["layers"][0] for s in stages[1:]]
        row["stage_params"] = [s.get("num_parameters") for s in stages]
        peaks = [(s.get("memory") or {}).get("device_peak_bytes", 0) for s in stages]
        if any(peaks):
            row["peak_gib"] = "/".join("%.2f" % (p / 2**30) for p in peaks)
        row["busy_fraction"] = "/".join("%.3f" % s.get("busy_fraction", 0) for s in stages)
    return row


def check_outside(args, row, job_path):
    """With --outside-steps N, the row's job run again N steps longer (and, with --outside-repeats R,
    R runs of that length and R - 1 more of the row's own, alternated, long first): the difference of
    the two lengths' shortest wall times over N (start-up and teardown cancel) beside the row's own
    figure, judged as bench.py judges its rows (a row more than 5% off is marked unless the runs'
    spread says the check was too noisy). Adds outside_ms_per_step, outside_ratio and outside_note to
    the row; a failed run is said in outside_note."""
    if not args.outside_steps or "ms_per_step" not in row:
        return row
    if args.outside_variants and row["variant"] not in args.outside_variants.split(","):
        return row
    short, long_ = args.steps, args.steps + args.outside_steps
    walls, clocks = {short: [row["wall_s"]], long_: []}, {short: [row["ms_per_step"]], long_: []}
    for n in bench_outside.outside_order(short, long_, max(1, args.outside_repeats)):
        again = run_conveyor(args, row["variant"], job_path, steps=n)
        if "wall_s" not in again or "ms_per_step" not in again:
            row["outside_note"] = "the outside clock's run of %d steps failed: %s" % (n, again.get("error", "no figures"))
            return row
        walls[n].append(again["wall_s"])
        clocks[n].append(again["ms_per_step"])
    outside_ms, ratio, notes = bench_outside.judge_outside(row["ms_per_step"], walls, clocks=clocks)
    row.update(outside_ms_per_step=round(outside_ms, 1), outside_ratio=round(ratio, 3), outside_note="; ".join(notes),
               outside_walls="; ".join("%d steps: %s s" % (n, "/".join("%.1f" % w for w in walls[n]))
                                       for n in (short, long_)))
    return row


def run_eager(args, model, tokens):
    import torch
    import torch.nn.functional as F
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    # The token file's batches in order, as torchscript-gpt reads it (shuffle: false): sample i is
    # tokens[i*T : i*T+T], its target the same window one token later (docs/models.md).
    data = torch.from_numpy(tokens.astype("int64")).to(dev)
    n = BATCH * T
    times, losses = [], []
    for step in range(args.steps):
        x = data[step * n:(step + 1) * n].view(BATCH, T)
        y = data[step * n + 1:(step + 1) * n + 1].view(BATCH, T)
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(loss.detach())
    model.to("cpu")
    del opt
    if cuda:
        torch.cuda.empty_cache()
    losses = [float(x) for x in losses]
    return {"variant": "pytorch-eager", "ms_per_step": round(1000 * statistics.median(times[WARMUP:] or times), 1),
            "final_loss": losses[-1], "losses": losses}


def default_boundary(blocks):
    # Stage 0: the embedding and blocks 0 .. K-2; for W2 (24 blocks) K = 14, balance: time's cut.
    return max(1, min(blocks + 1, blocks // 2 + 2))


def describe_cut(k, blocks):
    first = "embedding" + (", blocks 0-%d" % (k - 2) if k >= 3 else ", block 0" if k == 2 else "")
    rest = ("blocks %d-%d, " % (k - 1, blocks - 1) if k - 1 < blocks - 1 else
            "block %d, " % (k - 1) if k - 1 == blocks - 1 else "")
    return "%s | %sfinal norm and output layer" % (first, rest)


def compare_losses(rows, blocks):
    """Lines on how far apart the variants' final (and per-step) losses are."""
    got = {r["variant"]: r for r in rows if r.get("final_loss") is not None}
    # Which variants start from the same weights and see the same batches.
    family = {"pytorch-eager": "script", "torchscript-gpt": "script", "torchscript-gpt-2stage": "script",
              "zoo-gpt": "zoo", "zoo-gpt-2stage": "zoo", "exported-gpt": "script", "exported-gpt-unfused": "script",
              "exported-gpt-2stage": "script"}
    pairs = [("zoo-gpt-2stage", "torchscript-gpt-2stage"), ("zoo-gpt-2stage", "zoo-gpt"),
             ("torchscript-gpt-2stage", "torchscript-gpt"), ("torchscript-gpt-2stage", "pytorch-eager"),
             ("torchscript-gpt", "pytorch-eager"), ("zoo-gpt", "torchscript-gpt"),
             ("exported-gpt", "torchscript-gpt"), ("exported-gpt-2stage", "torchscript-gpt-2stage"),
             ("exported-gpt", "exported-gpt-unfused")]
    lines = []
    for a, b in pairs:
        if a not in got or b not in got:
            continue
        fa, fb = float(got[a]["final_loss"]), float(got[b]["final_loss"])
        line = "%s - %s: final loss %.4f - %.4f = %+.2e (relative %.1e)" % (a, b, fa, fb, fa - fb,
                                                                              abs(fa - fb) / max(abs(fb), 1e-30))
        la, lb = got[a].get("losses") or [], got[b].get("losses") or []
        if la and lb and len(la) == len(lb):
            line += ", largest per-step difference %.2e" % max(abs(x - y) for x, y in zip(la, lb))
        if family[a] == family[b]:
            line += "; same initial weights and batches"
        else:
            line += "; different initial weights (zoo: Conveyor's seeded init; script: torch.manual_seed(0)) " \
                    "and data (synthetic against the token file): only the same magnitude is expected"
        lines.append(line)
    cuts = {r["variant"]: r.get("boundaries") for r in rows if r["variant"] in TWO_STAGE and r.get("boundaries")}
    if "zoo-gpt-2stage" in cuts and "torchscript-gpt-2stage" in cuts:
        z, s = cuts["zoo-gpt-2stage"], cuts["torchscript-gpt-2stage"]
        if z == s:
            lines.append("both 2-stage variants cut at layer %s: %s" % (
                z[0] if len(z) == 1 else z, describe_cut(z[0], blocks) if len(z) == 1 else ""))
            pz, ps = (next(r.get("stage_params") for r in rows if r["variant"] == v)
                      for v in ("zoo-gpt-2stage", "torchscript-gpt-2stage"))
            lines.append("parameters per stage: zoo %s, script %s%s" % (
                "/".join(map(str, pz)), "/".join(map(str, ps)), " (equal)" if pz == ps else " (NOT equal)"))
        else:
            lines.append("the 2-stage variants cut at different places: zoo %s, script %s "
                         "(the zoo's layer list has one more layer at the end: norm and output apart)" % (z, s))
    return lines


def main():
    global V, W, H, M, T, BATCH
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--out", default="torchscript-w2")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--device", default="cuda:0", help="the 1-device variants' device; cpu also puts the "
                   "2-stage variants' stage servers on the CPU, anything else on GPUs 0 and 1")
    p.add_argument("--blocks", type=int, default=24)
    p.add_argument("--variants", default=None,
                   help="comma-separated, of %s (default: all that fit: the 2-stage ones need 2 GPUs)"
                   % ",".join(VARIANTS))
    p.add_argument("--schedule", default="1f1b", help="the 2-stage variants' schedule")
    p.add_argument("--micro-batches", type=int, default=8, help="the 2-stage variants' micro-batches")
    p.add_argument("--boundary", type=int, default=None,
                   help="first layer of stage 1, the same for both 2-stage variants, 1 .. blocks + 1 "
                        "(default blocks // 2 + 2: 14 for W2)")
    p.add_argument("--balance", choices=["layers", "params", "time"], default=None,
                   help="instead of --boundary: partition {stages: 2, balance: ...}, each variant cut on its own")
    p.add_argument("--vocab", type=int, default=V)
    p.add_argument("--width", type=int, default=W)
    p.add_argument("--heads", type=int, default=H)
    p.add_argument("--mlp-width", type=int, default=M)
    p.add_argument("--seq-len", type=int, default=T)
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--timeout", type=int, default=400, help="seconds per Conveyor variant")
    p.add_argument("--outside-steps", type=int, default=0,
                   help="check each Conveyor row from outside: run it again this many steps longer and "
                        "give the two wall times' difference over these steps beside its own figure (0: no check)")
    p.add_argument("--outside-variants", default=None,
                   help="comma-separated: check only these rows from outside (default: every Conveyor row)")
    p.add_argument("--outside-repeats", type=int, default=2,
                   help="runs of each length for the outside check (the row's own run one of them); the "
                        "shortest wall of each length counts (W2's start-up varies by seconds)")
    args = p.parse_args()
    V, W, H, M, T, BATCH = args.vocab, args.width, args.heads, args.mlp_width, args.seq_len, args.batch
    if args.balance and args.boundary is not None:
        p.error("--boundary or --balance, not both")
    boundary = args.boundary if args.boundary is not None else default_boundary(args.blocks)
    if not args.balance and not 1 <= boundary <= args.blocks + 1:
        p.error("--boundary must lie in 1 .. %d (blocks + 1): the zoo's layer %d has no match in the script "
                "(its Head holds the final norm and the output layer)" % (args.blocks + 1, args.blocks + 2))
    if V > 65536:
        p.error("--vocab: the token file holds uint16 ids")
    if W % H:
        p.error("--width must be a multiple of --heads")

    import numpy as np
    import torch
    wanted = args.variants.split(",") if args.variants else list(VARIANTS)
    unknown = [v for v in wanted if v not in VARIANTS]
    if unknown:
        p.error("unknown variant(s) %s; known: %s" % (",".join(unknown), ",".join(VARIANTS)))
    skipped = []
    if any(v in TWO_STAGE for v in wanted) and args.device != "cpu":
        gpus = count_gpus(args)
        if gpus < 2:
            why = "needs 2 GPUs, %d here (conveyor local would put both stages on one)" % gpus
            skipped = [{"variant": v, "error": "not run: " + why} for v in wanted if v in TWO_STAGE]
            wanted = [v for v in wanted if v not in TWO_STAGE]
            print("note: %s skipped: %s" % (", ".join(r["variant"] for r in skipped), why), file=sys.stderr)

    os.makedirs(args.out, exist_ok=True)
    out = args.out = os.path.abspath(args.out)
    t0 = time.time()
    model = build(args.blocks)
    torch.jit.script(model).save(os.path.join(out, "w2.pt"))
    tokens = np.random.default_rng(0).integers(0, V, size=BATCH * T * (args.steps + args.outside_steps + 1) + 1, dtype=np.uint16)
    tokens.tofile(os.path.join(out, "tokens.bin"))
    print("scripted %d parameters (%d layers) in %.0f s" % (sum(q.numel() for q in model.parameters()),
                                                             len(model), time.time() - t0), file=sys.stderr)
    common = ["batch_size: %d" % BATCH, "precision: bf16", "optimizer: {name: sgd, lr: 0.001}",
              "steps: %d" % args.steps, "stage_timeout: 120"]
    one = ["micro_batches: 1"]
    if args.balance:
        two = ["partition: {stages: 2, balance: %s}" % args.balance]
    else:
        two = ["partition: {stages: 2, boundaries: [%d]}" % boundary]
    two += ["micro_batches: %d" % args.micro_batches, "schedule: %s" % args.schedule]
    zoo_model = ("model: {name: gpt, vocab: %d, width: %d, blocks: %d, heads: %d, mlp_width: %d, seq_len: %d}"
                 % (V, W, args.blocks, H, M, T))
    zoo_data = "data: {name: synthetic, train_samples: %d, test_samples: 0}" % (BATCH * (args.steps + args.outside_steps))
    if any(v in EXPORTED for v in wanted):
        why = export_program(model, tokens, os.path.join(out, "w2.pt2"))
        if why:
            skipped += [{"variant": v, "error": "not run: " + why} for v in wanted if v in EXPORTED]
            wanted = [v for v in wanted if v not in EXPORTED]
            print("note: exported variants skipped: %s" % why, file=sys.stderr)
    # The program's layers are the cuts asked for: none on one device, child K of the Sequential
    # on two (its stages are the other 2-stage variants' with explicit boundaries).
    exported_model = "model: {exported: w2.pt2}"
    exported_two = ["model: {exported: w2.pt2, cut_before: \"%d\"}" % boundary, "partition: {stages: 2}",
                    "micro_batches: %d" % args.micro_batches, "schedule: %s" % args.schedule]
    script_model = "model: {torchscript: w2.pt}"
    script_data = "data: {format: tokens, train: tokens.bin, dtype: uint16, seq_len: %d, shuffle: false}" % T
    jobs = {"zoo-gpt": ("zoo.yaml", [zoo_model, zoo_data] + common + one),
            "torchscript-gpt": ("script.yaml", [script_model, script_data] + common + one),
            "zoo-gpt-2stage": ("zoo-2stage.yaml", [zoo_model, zoo_data] + common + two),
            "torchscript-gpt-2stage": ("script-2stage.yaml", [script_model, script_data] + common + two),
            "exported-gpt": ("exported.yaml", [exported_model, script_data] + common + one),
            "exported-gpt-unfused": ("exported-unfused.yaml",
                                     ["model: {exported: w2.pt2, fused: false}", script_data] + common + one),
            "exported-gpt-2stage": ("exported-2stage.yaml", [script_data] + common + exported_two)}
    for name, (path, lines) in jobs.items():
        job(os.path.join(out, path), ["name: " + name] + lines)
    if not args.balance and any(v in TWO_STAGE for v in wanted):
        print("2-stage cut: partition.boundaries [%d]: %s" % (boundary, describe_cut(boundary, args.blocks)),
              file=sys.stderr)

    rows = []
    for v in VARIANTS:  # this order: the 1-device ones first
        if v not in wanted:
            continue
        if v == "pytorch-eager":
            rows.append(run_eager(args, model, tokens))
        else:
            job_path = os.path.join(out, jobs[v][0])
            rows.append(check_outside(args, run_conveyor(args, v, job_path), job_path))
        r = rows[-1]
        print("  %s: %s%s" % (v, "%.1f ms/step, final loss %.4f" % (r["ms_per_step"], r["final_loss"])
                              if "ms_per_step" in r else r["error"],
                              "; outside %s ms/step (%sx) %s" % (r["outside_ms_per_step"], r["outside_ratio"],
                                                                r["outside_note"]) if "outside_ratio" in r
                              else "; " + r["outside_note"] if "outside_note" in r else ""),
              file=sys.stderr, flush=True)
    del model
    rows += skipped

    zoo = next((r["ms_per_step"] for r in rows if r["variant"] == "zoo-gpt" and "ms_per_step" in r), None)
    print("| variant | ms / step | vs zoo-gpt | final loss | stages | outside clock (ms, ratio) |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        ms = r.get("ms_per_step")
        loss = r.get("final_loss")
        outside = ("%s, %sx%s" % (r["outside_ms_per_step"], r["outside_ratio"],
                                  " " + r["outside_note"] if r["outside_note"] else "")
                   if "outside_ratio" in r else r.get("outside_note", "-"))
        print("| %s | %s | %s | %s | %s | %s |" % (r["variant"], ms if ms else r.get("error"),
                                                  "%.3f" % (ms / zoo) if ms and zoo else "-",
                                                  "%.4f" % loss if loss is not None else "-",
                                                  r.get("stages", "1 device" if ms else "-"), outside))
    lines = compare_losses(rows, args.blocks)
    if lines:
        print("\nfinal losses (bf16: not bit-equal; a pipeline sums 2 or more micro-batches' gradients):")
        for line in lines:
            print("- " + line)
    fields = ["variant", "ms_per_step", "final_loss", "stages", "peak_gib", "busy_fraction", "wall_s",
              "outside_ms_per_step", "outside_ratio", "outside_walls", "outside_note", "note", "error"]
    with open(os.path.join(out, "torchscript-w2.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    print("\nwrote %s" % os.path.join(out, "torchscript-w2.csv"))
    return 0 if all("ms_per_step" in r for r in rows if r not in skipped) else 1


if __name__ == "__main__":
    sys.exit(main())
