"""The outside clock's judgement (bench.py, dp_gpu.py and torchscript_w2.py): a row's ms per step from
the difference of two run lengths' wall times, set against the row's own clock."""



OUTSIDE_TOLERANCE = 0.05  # a row whose outside clock differs by more is marked


def clocks_disagree(ratio):
    """Whether a row's outside clock (outside / inside, as a ratio) differs from its own by more than allowed."""
    return abs(float(ratio) - 1) > OUTSIDE_TOLERANCE


def median_run(runs, key):
    """The run whose `key` is the median of `runs` (the lower middle one of an even count)."""
    ordered = sorted(runs, key=key)
    return ordered[(len(ordered) - 1) // 2]


def outside_order(short, long_, repeats, have_short=1):
    """The runs an outside check adds, by length: `repeats` runs of `long_` and enough of `short` to
    make `repeats` with the `have_short` already run. Alternated, long first: what drifts during the
    call falls on both lengths."""
    n_short = max(0, repeats - have_short)
    order = []
    for i in range(max(repeats, n_short)):
        order += ([long_] if i < repeats else []) + ([short] if i < n_short else [])
    return order


def same_runs_ratio(outside_ms, walls, clocks):
    """The outside figure over the own clock of the long run it came from (the long length's shortest
    wall): the two clocks of the same run, which run-to-run spread does not move; None without it."""
    if not clocks:
        return None
    long_ = max(walls)
    own = clocks[long_][walls[long_].index(min(walls[long_]))]
    return outside_ms / own if own == own and own > 0 else None


def judge_outside(inside_ms, walls, recoveries=0, clocks=None):
    """What the outside clock says of a row: (outside ms/step, outside / inside, notes). `walls` maps
    each of two run lengths (steps) to its runs' wall times (s). The outside figure is the difference
    of the two lengths' shortest wall times over the difference of their steps; its noise, the two
    lengths' spreads (longest minus shortest) over the same. A difference of more than
    OUTSIDE_TOLERANCE is marked CLOCKS DISAGREE, unless it lies within the noise and the noise itself
    is past the tolerance: then the outside clock was too noisy to judge the row. With `clocks` (each
    run's own ms/step, by length, as `walls`) a row's run that the outside figure disagrees with while
    the long run it came from agrees (same_runs_ratio) is a slow or fast run, not a wrong clock: the
    note says so and gives every run's clock. Recoveries in the runs are named whatever the figures:
    the steady clock leaves a recovery out, the wall time does not."""
    short, long_ = sorted(walls)
    span = long_ - short
    outside_ms = 1000.0 * (min(walls[long_]) - min(walls[short])) / span
    noise_ms = 1000.0 * sum(max(w) - min(w) for w in walls.values()) / span
    ratio = outside_ms / inside_ms
    notes = []
    if recoveries:
        notes.append("RECOVERED %d time(s) in these runs: the row's steady clock leaves recoveries out" % recoveries)
    same = same_runs_ratio(outside_ms, walls, clocks)
    if clocks_disagree(ratio):
        if same is not None and not clocks_disagree(same):
            notes.append("this run's clock is off the check's runs (run-to-run spread; each run's own ms/step: %s); "
                         "the long run's own clock agrees with the outside one (%.3fx)"
                         % ("; ".join("%d steps: %s" % (n, "/".join("%.1f" % c for c in cs))
                                      for n, cs in sorted(clocks.items())), same))
        elif noise_ms > OUTSIDE_TOLERANCE * inside_ms and abs(outside_ms - inside_ms) <= noise_ms:
            notes.append("outside clock too noisy to judge: %.1f +- %.1f ms/step (runs of %d and %d steps)"
                         % (outside_ms, noise_ms, short, long_))
        else:
            notes.append("CLOCKS DISAGREE: outside %.1f ms/step (runs of %d and %d steps)" % (outside_ms, short, long_))
    return outside_ms, ratio, notes
