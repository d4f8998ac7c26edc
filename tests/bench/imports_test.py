#!/usr/bin/env python3
"""The Python files of bench/ import each other one way only: no module reaches itself through the
modules it imports, at module level or inside a function (ctest bench.imports). Reads the files;
imports nothing from them."""
import ast
import os
import unittest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")


def local_imports(path, local):
    """The modules of `local` that the file at `path` imports anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in local)
        elif isinstance(node, ast.ImportFrom) and node.module in local and not node.level:
            found.add(node.module)
    return found


def graph(folder):
    local = {f[:-3] for f in os.listdir(folder) if f.endswith(".py")}
    return {m: local_imports(os.path.join(folder, m + ".py"), local) - {m} for m in local}


def cycle(edges):
    """One cycle of the graph as a list of modules (its first repeated at its end), or None."""
    state = {}

    def visit(m, path):
        state[m] = "open"
        for n in sorted(edges.get(m, ())):
            if state.get(n) == "open":
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n, path + [n])
                if found:
                    return found
        state[m] = "done"
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


class Imports(unittest.TestCase):
    def test_no_cycle_among_bench_modules(self):
        found = cycle(graph(BENCH))
        self.assertIsNone(found, "import cycle: %s" % " -> ".join(found or []))

    def test_the_walker_finds_a_cycle(self):
        self.assertEqual(cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}), ["a", "b", "c", "a"])
        self.assertIsNone(cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}))


if __name__ == "__main__":
    unittest.main()
