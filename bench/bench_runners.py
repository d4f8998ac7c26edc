"""bench.py's runs: one Conveyor variant (`conveyor train --reference` or `conveyor local`) and its check
from outside, and PyTorch's variants through torch_pipelining.py and torch_single.py."""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from bench_workloads import HERE, WARMUP, asked_batch, base_name, batch_size, batch_suffix, job_text, pipelined
from bench_outside import judge_outside, outside_order, same_runs_ratio


def conveyor_command(args, v, job_path):
    exe = os.path.join(args.bin, "conveyor")
    profile = []
    if args.profile_dir:  # a folder per run: each local cluster numbers its jobs from 1
        profile = ["--profile-dir", os.path.abspath(os.path.join(args.profile_dir, "%s-%s" % (args.workload, v["variant"])))]
    if v["variant"].startswith("conveyor-1dev"):
        return [exe, "train", job_path, "--reference", "--device", args.device, "--json"] + profile
    # One stage server per stage and replica, as the row names it: `conveyor local` would fold stages
    # that outnumber the GPUs into one server per GPU (plan/placement.h).
    cmd = [exe, "local", job_path, "--json"] + profile
    if os.path.exists(job_path):  # not under --dry-run
        text = open(job_path).read()
        stages = re.search(r"(?m)^partition: \{stages: (\d+)", text)
        replicas = re.search(r"(?m)^replicas: (\d+)", text)
        cmd += ["--stages", str((int(stages.group(1)) if stages else 1) * (int(replicas.group(1)) if replicas else 1))]
    if args.trace_dir:  # the last step's timeline (device times of the compute on GPUs)
        os.makedirs(args.trace_dir, exist_ok=True)
        cmd += ["--trace", os.path.join(args.trace_dir, "%s-%s" % (args.workload, v["variant"]))]
    return cmd


def stop_stage_servers(args):
    """After a timed-out run: its stage servers get SIGTERM when `conveyor` dies, but one stuck
    on its device would go on holding it and skew every later variant. Kill what is left."""
    pattern = re.escape(os.path.join(args.bin, "stage_server"))
    left = subprocess.run(["pkill", "-KILL", "-f", pattern], capture_output=True)
    if left.returncode == 0:
        print("  killed stage servers left running (%s)" % pattern, file=sys.stderr)


def run_conveyor(args, workload, v, steps=None):
    """One run of a Conveyor variant for `steps` (default --steps): its JSON result (with `wall_s`,
    the process's wall time) and a note, or None and why not."""
    steps = steps or args.steps
    schedule = "gpipe" if v["schedule"] == "naive" else v["schedule"] or None
    micro_batches = v["m"]  # the reference trains on whole batches: 1, so that a split_size fits any --batch
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        # The last warm-up step is the one profiled: it is not timed.
        extra = args.set + (["profile_step=%d" % WARMUP] if args.profile_dir else [])
        extra += ["cuda_graphs=true"] if v.get("graphs") else []
        extra += v.get("set", [])
        extra += ["replicas=%d" % args.replicas] if args.replicas > 1 and pipelined(v) else []
        f.write(job_text(workload, steps, schedule=schedule, micro_batches=micro_batches, extra=extra,
                         stages=v.get("stages", args.ranks)))
        path = f.name
    cmd = conveyor_command(args, v, path)
    log = os.path.join(args.out, "%s-%s%s.log" % (workload, v["variant"], "" if steps == args.steps else "-%d" % steps))
    try:
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        wall = time.perf_counter() - started
    except subprocess.TimeoutExpired as e:
        print("  %s: past %d s, stopped (log: %s)" % (v["variant"], args.timeout, log), file=sys.stderr)
        with open(log, "w") as f:  # what it said before it was stopped
            f.write(e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or "")
        stop_stage_servers(args)
        return None, "timeout"
    except OSError as e:
        print("  %s: cannot run %s: %s" % (v["variant"], cmd[0], e), file=sys.stderr)
        return None, "not run"
    finally:
        os.unlink(path)
    with open(log, "w") as f:
        f.write(proc.stderr)
    result = None
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else None
    except ValueError:
        pass
    note = ""
    if proc.returncode != 0:
        # A job can succeed and print its result before the CLI dies on the way out (seen once
        # on the GPU machine): keep the job's own figure, and say so.
        if result and result.get("state") == "succeeded":
            note = "conveyor exited %d after the job succeeded" % proc.returncode
        else:
            print("  %s failed (exit %d), see %s" % (v["variant"], proc.returncode, log), file=sys.stderr)
            return None, "exit %d" % proc.returncode
    if not result or not result.get("steady_samples_per_second"):
        print("  %s: no steady rate in its output, see %s" % (v["variant"], log), file=sys.stderr)
        return None, "no result"
    result["wall_s"] = wall
    return result, note


def median_steady_ms(r):
    """The median of a Conveyor run's steady steps' own times (its step_seconds after the warm-up), in ms, or
    None: a diagnostic beside the mean: well under it, a few slow steps make the mean. PyTorch's rows time
    one window of steps and have none."""
    steady = sorted(r.get("step_seconds", [])[WARMUP:])
    return 1000.0 * steady[len(steady) // 2] if steady else None


def median_step_ms(r):
    """median_steady_ms as the CSV's column: two decimals, or empty."""
    ms = median_steady_ms(r)
    return "%.2f" % ms if ms is not None else ""


def own_ms(workload, args, r):
    """A run's own clock, ms per step (nan where it has none)."""
    sps = r.get("steady_samples_per_second")
    return 1000.0 * batch_size(workload, args) / sps if sps else float("nan")


def repeated(args, statistic):
    """The statistic column of a row measured --repeats times: the median run's."""
    return statistic if args.repeats <= 1 else "median of %d runs, each the %s" % (args.repeats, statistic)


def outside_check(args, workload, v, firsts, inside_ms):
    """The variant run again, at --outside-steps and at --steps (--outside-repeats runs of each
    length, the row's own runs `firsts` counting as runs of --steps): ms per step from the difference
    of the two lengths' shortest wall times (start-up, loading and teardown cancel; the shortest,
    since what varies from run to run there, cuDNN's autotuning, the page cache, only ever adds), and
    its ratio to the row's figure `inside_ms`."""
    more = args.outside_steps
    if more is None:  # long enough that the steps' time dwarfs what start-up varies by (seconds on W2)
        more = args.steps + max(2 * args.steps + 2, int(1000.0 * args.outside_seconds / inside_ms) + 1)
    if not more or more <= args.steps:
        return {}
    walls = {args.steps: [r["wall_s"] for r in firsts], more: []}
    clocks = {args.steps: [own_ms(workload, args, r) for r in firsts], more: []}  # each run's own clock, ms/step
    recoveries = sum(int(r.get("recoveries") or 0) for r in firsts)
    for n in outside_order(args.steps, more, args.outside_repeats, len(firsts)):
        r, _ = run_conveyor(args, workload, v, steps=n)
        if not r:
            return {"note": "outside check failed (a run of %d steps)" % n}
        walls[n].append(r["wall_s"])
        clocks[n].append(own_ms(workload, args, r))
        recoveries += int(r.get("recoveries") or 0)
    outside_ms, ratio, notes = judge_outside(inside_ms, walls, recoveries, clocks)
    out = {"outside_ms_per_step": "%.2f" % outside_ms, "outside_ratio": "%.3f" % ratio,
           "outside_walls": "; ".join("%d steps: %s s" % (n, "/".join("%.2f" % w for w in ws))
                                      for n, ws in sorted(walls.items())),
           "runs_own_ms": "; ".join("%d steps: %s" % (n, "/".join("%.2f" % c for c in cs))
                                    for n, cs in sorted(clocks.items()))}
    same = same_runs_ratio(outside_ms, walls, clocks)
    if same is not None:
        out["outside_same_runs_ratio"] = "%.3f" % same
    if notes:
        out["note"] = "; ".join(notes)
    return out


def torch_probe(args):
    """How many GPUs the python3 of --python sees through torch; None if it cannot import torch."""
    try:
        proc = subprocess.run([args.python, "-c", "import torch; print(torch.cuda.device_count())"],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        return int(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def torch_command(args, workload, schedules, mbs, names=()):
    if schedules == ["best"]:
        cmd = [args.python, os.path.join(HERE, "torch_single.py"), workload, "--steps", str(max(1, args.steps - WARMUP)),
               "--warmup", str(WARMUP), "--variants", ",".join(base_name(n) for n in names)]
        if args.profile_dir:
            cmd += ["--profile-dir", os.path.abspath(args.profile_dir)]
        return cmd + (["--batch", str(asked_batch(args))] if asked_batch(args) else [])
    cmd = [args.python, os.path.join(HERE, "torch_pipelining.py"), workload, "--schedules", ",".join(schedules),
           "--steps", str(max(1, args.steps - WARMUP)), "--warmup", str(WARMUP),
           "--ranks", str(args.ranks), "--timeout", str(max(30, args.timeout - 15))]
    if args.replicas > 1:
        cmd += ["--replicas", str(args.replicas), "--dp", args.dp]
    mbs = sorted(set(m for m in mbs if m))
    if mbs:
        cmd += ["--micro-batches", ",".join(str(m) for m in mbs)]
    if asked_batch(args):
        cmd += ["--batch", str(asked_batch(args))]
    if args.profile_dir:
        cmd += ["--profile-dir", os.path.abspath(args.profile_dir)]
    if args.torch_channels_last:
        cmd += ["--channels-last"]
    return cmd


def run_torch(args, workload, group, schedules, mbs, names=()):
    """One torch_pipelining.py call (the one-process variants, or one pipelined schedule), or
    one torch_single.py call (the best single-GPU variants): its JSON lines, by variant name."""
    cmd = torch_command(args, workload, schedules, mbs, names)
    log = os.path.join(args.out, "%s-torch-%s%s.log" % (workload, group, batch_suffix(args)))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 30, env=env)
        stdout, stderr = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        stdout, stderr = e.stdout or "", e.stderr or ""
        stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
        stderr = stderr.decode() if isinstance(stderr, bytes) else stderr
        print("  torch %s: past %d s, stopped" % (group, args.timeout + 30), file=sys.stderr)
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n" + stderr + stdout)
    out = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                r = json.loads(line)
                out[r["variant"]] = r
            except (ValueError, KeyError):
                pass
    return out
