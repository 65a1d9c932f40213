"""What the tests of the GPU scripts share: stand-in programs, each a small shell script that
runs a function of the test file that made it (`python3 TEST_FILE --tool NAME ARGS...`)."""

import os
import stat
import sys


def make_tool(path, name, test_file):
    """Writes an executable at path that runs test_file's stand-in for the tool name."""
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nexec "{sys.executable}" "{os.path.abspath(test_file)}" --tool {name} '
                '"$@"\n')
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
