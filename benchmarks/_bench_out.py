"""Where a benchmark's JSON goes, shared by the benchmarks that keep runs as a dict."""

import datetime
import json
import os
import statistics
import sys


def write_runs(kind, path, runs):
    """Writes {"argv", "runs"} to `path` (default bench-results/<kind>-<time>.json); prints it."""
    path = path or os.path.join("bench-results", f"{kind}-{datetime.datetime.now():%Y-%m-%d-%H%M%S}.json")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump({"argv": sys.argv[1:], "runs": runs}, f, indent=1)
    print(f"\nJSON: {path}")


def spread(xs, digits=2):
    """'min / median / max' of xs."""
    xs = sorted(xs)
    return " / ".join(f"{x:.{digits}f}" for x in (xs[0], statistics.median(xs), xs[-1]))


def print_table(header, rows, columns):
    """A markdown table: `header` names every column; each row is (cells, runs), and its
    remaining columns are each of `columns` applied to the runs that went well ("-" if
    none did), after a "runs ok" count."""
    print("\n| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for cells, runs in rows:
        ok = [r for r in runs if r["ok"]]
        values = [column(ok) for column in columns] if ok else ["-"] * len(columns)
        print("| " + " | ".join([*map(str, cells), f"{len(ok)}/{len(runs)}", *values]) + " |")
