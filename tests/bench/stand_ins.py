"""What the tests of the bench scripts share: stand-in programs, each a small shell script that
runs a function of the test file that made it (`python3 TEST_FILE --tool NAME ARGS...`), and the
pieces of the results those stand-ins write."""

import os
import stat
import sys


def make_tool(path, name, test_file, flag="--tool"):
    """Writes an executable at path that runs test_file's stand-in for the tool name (`flag`
    tells the test file which set of stand-ins)."""
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nexec "{sys.executable}" "{os.path.abspath(test_file)}" {flag} {name} '
                '"$@"\n')
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def option(args, name, default=None):
    """The value after `name` in a tool's arguments, or `default`."""
    return args[args.index(name) + 1] if name in args else default


def step_run(model, precision, mode, median_ms, train=True):
    """One run of a bench_train / train.py JSON, with made-up figures (a loss when `train`)."""
    run = {"model": model, "precision": precision, "mode": mode, "peak_bytes": 1 << 20,
           "step_ms": {"median": median_ms, "p10": median_ms, "p90": median_ms}}
    if train:
        run.update(final_loss=0.5, loss_last10_mean=0.5)
    return run
