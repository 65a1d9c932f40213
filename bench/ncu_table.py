#!/usr/bin/env python3
"""Turns Nsight Compute's CSV (`ncu --csv --log-file FILE`, its details page: one row per kernel
launch and metric) into Markdown tables, one row per launch.

Each row gives the launch's metrics in the order the CSV first names them (times in µs, the
well-known metrics under short labels, see LABELS), then the kernel: its function's name and
its template arguments, shortened. With --step REGEX only one training step's launches are kept:
those after the first launch whose kernel name matches REGEX, up to and including the next such
launch (a step that ends with one optimizer launch, e.g. sine's `adam_kernel`, is so taken whole,
from the launch after the previous step's optimizer to its own). A summary per kernel function
follows each table (launches, µs, share of the table's total), when the table has a time.

    python3 bench/ncu_table.py [--title TEXT] [--step REGEX] CSV

Exits 1 when the CSV holds no launch, or --step's REGEX does not match twice.
"""
import argparse
import collections
import csv
import re
import sys

# Short column labels for the metrics bench/profile-gpu.sh collects; others keep their own names.
LABELS = {
    "gpu__time_duration.sum": "µs",
    "launch__grid_size": "grid",
    "launch__block_size": "block",
    "launch__registers_per_thread": "regs",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe %",
    "smsp__issue_active.avg.per_cycle_active": "issued / cycle",
    "smsp__average_warps_active_per_issue_active.ratio": "cycles / issue",
    "sm__warps_active.avg.per_cycle_active": "warps / SM",
}
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio")
TIME_UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3,
              "ms": 1e3, "second": 1e6, "s": 1e6}
TIME = "gpu__time_duration.sum"


def label(metric):
    """The column label of a metric: LABELS', 'stall NAME' for a stall reason's cycles per
    issued instruction, or the metric's own name."""
    found = STALL.fullmatch(metric)
    return LABELS.get(metric) or (f"stall {found.group(1)}" if found else metric)


def number(text):
    """A metric value as a float ('2,048' has ncu's thousands separator), or None."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def read_launches(path):
    """The CSV's launches in order: [{'id', 'kernel', 'metrics': {name: value}}], times in µs.
    Lines before the header (ncu's own ==PROF== messages) are skipped."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return [], []
    launches, order = {}, []
    for row in csv.DictReader(lines[start:]):
        if not row.get("Metric Name") or row.get("ID") is None:
            continue
        launch = launches.setdefault(row["ID"], {"id": row["ID"], "kernel": row["Kernel Name"],
                                                 "metrics": {}})
        name, value = row["Metric Name"], number(row["Metric Value"] or "")
        if value is not None and name == TIME:
            value *= TIME_UNITS.get(row.get("Metric Unit", "usecond"), 1.0)
        launch["metrics"][name] = value
        if name not in order:
            order.append(name)
    return sorted(launches.values(), key=lambda launch: int(launch["id"])), order


def strip_parameters(name):
    """The kernel name without its parameter list (the last top-level '(...)') and return type."""
    name = name.replace("(anonymous namespace)::", "")
    name = re.sub(r"^void ", "", name)
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                return name[:i]
    return name


def short_kernel(name, width=90):
    """(function, template arguments) of a demangled kernel name: the function without its
    namespaces, the arguments without namespaces, cut to width characters."""
    name = strip_parameters(name)
    function, _, arguments = name.partition("<")
    function = function.split("::")[-1]
    arguments = re.sub(r"\b\w+::", "", arguments[:-1] if arguments.endswith(">") else arguments)
    if len(arguments) > width:
        arguments = arguments[:width - 3] + "..."
    return function, arguments


def one_step(launches, pattern):
    """The launches after the first whose kernel matches pattern, up to and including the next."""
    ends = [i for i, launch in enumerate(launches) if re.search(pattern, launch["kernel"])]
    if len(ends) < 2:
        return None
    return launches[ends[0] + 1:ends[1] + 1]


def cell(metric, value):
    if value is None:
        return "n/a"
    if metric in ("launch__grid_size", "launch__block_size", "launch__registers_per_thread"):
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 or metric == TIME else f"{value:.2f}"


def table(launches, order, title):
    """The Markdown of the launches and, when they have a time, the per-function summary."""
    times = [launch["metrics"].get(TIME) or 0.0 for launch in launches]
    total = sum(times)
    heading = f"## {title}: {len(launches)} kernels"
    lines = [heading + (f", {total:.1f} µs" if TIME in order else ""), ""]
    lines.append("| " + " | ".join(label(m) for m in order) + " | kernel | template arguments |")
    lines.append("|" + " ---: |" * len(order) + " --- | --- |")
    for launch in launches:
        function, arguments = short_kernel(launch["kernel"])
        values = [cell(m, launch["metrics"].get(m)) for m in order]
        lines.append("| " + " | ".join(values) + f" | {function} | {arguments} |")
    if TIME in order and total > 0:
        by_function = collections.OrderedDict()
        for launch, time in zip(launches, times):
            entry = by_function.setdefault(short_kernel(launch["kernel"])[0], [0, 0.0])
            entry[0] += 1
            entry[1] += time
        lines += ["", "| kernel | launches | µs | share |", "| --- | ---: | ---: | ---: |"]
        for function, (count, time) in sorted(by_function.items(), key=lambda kv: -kv[1][1]):
            lines.append(f"| {function} | {count} | {time:.1f} | {100 * time / total:.1f}% |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", help="ncu --csv --log-file output")
    parser.add_argument("--title", default="kernels", help="the table's heading")
    parser.add_argument("--step", metavar="REGEX",
                        help="keep one step: after the first launch matching REGEX, to the next")
    args = parser.parse_args()
    try:
        launches, order = read_launches(args.csv)
    except OSError as error:
        sys.exit(f"ncu_table: cannot read {args.csv}: {error.strerror}")
    if not launches:
        sys.exit(f"ncu_table: {args.csv} holds no kernel launch (no ncu CSV header or rows)")
    if args.step:
        step = one_step(launches, args.step)
        if step is None:
            sys.exit(f"ncu_table: --step '{args.step}' matches fewer than two of the "
                     f"{len(launches)} launches in {args.csv}")
        launches = step
    print(table(launches, order, args.title))


if __name__ == "__main__":
    main()
