#!/usr/bin/env python3
"""Draws bench/soak.sh's samples and prints its figures.

    bench/soak_plot.py soak.csv soak.png

Prints, for each process, the resident memory at the first sample after
warm-up (WARMUP_STEPS: 10000 steps, or $SOAK_WARMUP_STEPS), at the end, and
its growth per 1000 steps fitted over the steps after warm-up (a least-squares
line; before the kill and
after the recovery apart, with the step between), the job database's
size, and the CPU seconds each process used. The check "flat" passes when
every process grew by less than 1 KiB per 1000 steps after warm-up (a copy
that grows by a number a step, 4 bytes a float, would be 4 KiB and more),
and the job database by less than a byte a step after DB_WARMUP_STEPS.
"""
import csv
import os
import sys

# SOAK_WARMUP_STEPS overrides it: what fills up once and then stays (the
# allocator's arenas, SQLite's page cache of at most 2 MiB, the write-ahead
# log) takes longer than 10,000 steps to fill on a long run.
WARMUP_STEPS = int(os.environ.get("SOAK_WARMUP_STEPS", "10000"))
FLAT_KIB_PER_1000_STEPS = 1.0
# The job database grows until a job's curve rows reach their cap (20,000,
# coordinator/job_store.h) and the write-ahead log its usual size; past that,
# a row a step (about 100 bytes) would show as 100 bytes a step.
DB_WARMUP_STEPS = max(30000, WARMUP_STEPS)
FLAT_DB_BYTES_PER_STEP = 1.0


def fit_slope(xs, ys):
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0


def report(p, kind, warm, kill):
    """Prints process p's memory of `kind` (rss or anon) after warm-up and its
    growth; returns whether it is flat."""
    key = f"{p}_{kind}_kb"
    pts = [(r["step"], r[key]) for r in warm if r.get(key)]
    # Fitted apart before the kill and after the recovery (from WARMUP_STEPS
    # past it): the recovery configures the job anew once, which is not a
    # growth a step; stage 1 is another process after it.
    parts = [pts]
    if kill:
        parts = [[(s, m) for s, m in pts if s < kill[0]],
                 [(s, m) for s, m in pts if s >= kill[0] + WARMUP_STEPS]]
    parts = [q for q in parts if len(q) >= 2]
    if not parts:
        print(f"{p}: too few samples after warm-up")
        return True
    slopes = [fit_slope([s for s, _ in q], [m for _, m in q]) * 1000 for q in parts]  # KiB per 1000 steps
    ok = all(x < FLAT_KIB_PER_1000_STEPS for x in slopes)
    jump = f", {(parts[1][0][1] - parts[0][-1][1]) / 1024:+.1f} MiB across the recovery" if len(parts) == 2 else ""
    name = "RSS" if kind == "rss" else "anonymous RSS"
    print(f"{p}: {name} {pts[0][1] / 1024:.1f} MiB at step {int(pts[0][0])}, {pts[-1][1] / 1024:.1f} MiB at step "
          f"{int(pts[-1][0])}{jump}; " + " / ".join(f"{x:+.2f}" for x in slopes) +
          f" KiB per 1000 steps after warm-up{' (before / after the kill)' if len(slopes) == 2 else ''}"
          f" ({'flat' if ok else 'GROWS'})")
    return ok


def main():
    path, png = sys.argv[1], sys.argv[2]
    rows = [r for r in csv.DictReader(open(path)) if r["step"]]
    for r in rows:
        for k, v in r.items():
            if k != "event":
                r[k] = float(v) if v else None
    procs = ["coordinator", "stage0", "stage1", "watcher"]
    warm = [r for r in rows if r["step"] >= WARMUP_STEPS]
    print(f"samples: {len(rows)}, steps: {int(rows[-1]['step'])}, seconds: {rows[-1]['seconds']:.0f}")
    kill = [r["step"] for r in rows if r["event"]]
    flat = all([report(p, "rss", warm, kill) for p in procs])
    # The anonymous part (heap, stacks; soak.sh samples it from its second
    # version on): VmRSS also counts the libraries' file pages read in as
    # code runs, shared with other processes and given back under pressure.
    anon = [report(p, "anon", warm, kill) for p in procs if p + "_anon_kb" in rows[0]]
    db = [(r["step"], r["db_bytes"]) for r in rows if r["db_bytes"]]
    db_warm = [(s, b) for s, b in db if s >= DB_WARMUP_STEPS]
    db_slope = fit_slope([s for s, _ in db_warm], [b for _, b in db_warm])
    db_flat = len(db_warm) < 2 or db_slope < FLAT_DB_BYTES_PER_STEP
    print(f"job database: {db[0][1] / 2**20:.2f} MiB at step {int(db[0][0])}, {db[-1][1] / 2**20:.2f} MiB at step "
          f"{int(db[-1][0])}; {db_slope:.1f} bytes a step after step {DB_WARMUP_STEPS}"
          f" ({'flat' if db_flat else 'GROWS'})")
    flat = flat and db_flat
    last = rows[-1]
    print("CPU seconds: " + ", ".join(f"{p} {last[p + '_cpu_s']:.0f}" for p in ["coordinator", "stage0", "stage1"]
                                      if last[p + "_cpu_s"] is not None) + " (stage1: since its restart)")
    print("memory flat after warm-up: " + ("yes" if flat else "NO"))
    if anon:
        print("anonymous memory flat after warm-up: " + ("yes" if all(anon) else "NO"))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    steps = [r["step"] for r in rows]
    for p in procs:
        ax.plot(steps, [r[p + "_rss_kb"] / 1024 if r[p + "_rss_kb"] else float("nan") for r in rows], label=p)
    for r in rows:
        if r["event"]:
            ax.axvline(r["step"], color="grey", linestyle=":")
            bx.axvline(r["step"], color="grey", linestyle=":")
    ax.set_ylabel("resident memory (MiB)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right")
    ax.set_title("bench/soak.sh: a 2-stage toy job on the CPU (dotted: stage 1 killed and restarted)")
    bx.plot(steps, [r["db_bytes"] / 2**20 for r in rows], color="black")
    bx.set_ylabel("job database (MiB)")
    bx.set_xlabel("step")
    bx.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main())
