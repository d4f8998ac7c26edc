"""What the deploy/ checks share: failures collected, then one report."""
failures = []


def check(ok, what):
    """Records `what` as a failure unless `ok`; returns `ok`."""
    if not ok:
        failures.append(what)
    return ok


def finish(passed):
    """Prints the failures (exit 1) or `passed` (exit 0)."""
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        return 1
    print("PASS: " + passed)
    return 0
