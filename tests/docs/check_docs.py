"""Checks that the docs point at the code as it is (standard library only):

- every line link in README.md and docs/*.md, [`name`](path#L12) or [`name`](path#L12-L20), names
  an existing file, lines inside it, and a `name` that appears on those lines;
- every `path:12` or `path:12-20` written in backticks names an existing file and lines inside it;
- every test named as `Suite.Name` exists as TEST(Suite, Name) under tests/;
- the training loop README.md shows is, line for line, the one in examples/minimal_amp.cpp
  between its two "// the loop" markers.

    python3 tests/docs/check_docs.py [ROOT]    prints each problem; exit status 1 if any
"""

import os
import re
import sys

LINE_LINK = re.compile(r"\[`([^`]+)`\]\(([^)#\s]+)#L(\d+)(?:-L(\d+))?\)")
CODE_REFERENCE = re.compile(r"`([\w./-]+\.[A-Za-z]+):(\d+)(?:-(\d+))?`")
TEST_NAME = re.compile(r"`([A-Z][A-Za-z0-9]*)\.([A-Z][A-Za-z0-9]*)`")
TEST_DEFINITION = re.compile(r"\bTEST(?:_F|_P)?\(\s*(\w+)\s*,\s*(\w+)\s*\)")
LOOP_MARKER = "// the loop"


def documents(root):
    """README.md and the Markdown files under docs/, as paths relative to root."""
    names = ["README.md"]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        names += sorted(os.path.join("docs", n) for n in os.listdir(docs) if n.endswith(".md"))
    return [n for n in names if os.path.isfile(os.path.join(root, n))]


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def check_lines(root, doc, target, first, last):
    """The lines first..last (1-based) of target, or a problem string."""
    path = os.path.normpath(os.path.join(root, target))
    if not path.startswith(os.path.abspath(root)) or not os.path.isfile(path):
        return None, f"{doc}: {target} does not exist"
    lines = read_lines(path)
    if first < 1 or last < first or last > len(lines):
        return None, f"{doc}: {target}:{first}-{last} is outside its {len(lines)} lines"
    return lines[first - 1:last], None


def reference_problems(root):
    root = os.path.abspath(root)
    problems = []
    tests = defined_tests(root)
    for doc in documents(root):
        text = "\n".join(read_lines(os.path.join(root, doc)))
        doc_dir = os.path.dirname(os.path.join(root, doc))
        for name, target, first, last in LINE_LINK.findall(text):
            first, last = int(first), int(last or first)
            relative = os.path.relpath(os.path.join(doc_dir, target), root)
            lines, problem = check_lines(root, doc, relative, first, last)
            if problem:
                problems.append(problem)
            elif not any(name in line for line in lines):
                problems.append(f"{doc}: `{name}` is not on {relative}:{first}-{last}")
        for target, first, last in CODE_REFERENCE.findall(text):
            first, last = int(first), int(last or first)
            _, problem = check_lines(root, doc, target, first, last)
            if problem:
                problems.append(problem)
        for suite, name in TEST_NAME.findall(text):
            if (suite, name) not in tests:
                problems.append(f"{doc}: no test {suite}.{name} under tests/")
    return problems


def defined_tests(root):
    """(suite, name) of every TEST, TEST_F and TEST_P under tests/."""
    found = set()
    for folder, _, files in os.walk(os.path.join(root, "tests")):
        for f in files:
            if f.endswith((".cpp", ".cu", ".h")):
                text = "\n".join(read_lines(os.path.join(folder, f)))
                found.update(TEST_DEFINITION.findall(text))
    return found


def dedent(lines):
    indent = min((len(l) - len(l.lstrip(" ")) for l in lines if l.strip()), default=0)
    return [l[indent:] for l in lines]


def minimal_loop(root):
    """The lines of examples/minimal_amp.cpp between its two loop markers, dedented."""
    lines = read_lines(os.path.join(root, "examples", "minimal_amp.cpp"))
    marks = [i for i, line in enumerate(lines) if line.strip() == LOOP_MARKER]
    if len(marks) != 2:
        return None
    return dedent(lines[marks[0] + 1:marks[1]])


def code_blocks(text):
    """The lines of each fenced code block of a Markdown text."""
    return [block.split("\n") for block in re.findall(r"```[a-z]*\n(.*?)\n```", text, re.S)]


def readme_loop_problems(root):
    loop = minimal_loop(root)
    if loop is None:
        return [f"examples/minimal_amp.cpp: expected two '{LOOP_MARKER}' lines around the loop"]
    readme = "\n".join(read_lines(os.path.join(root, "README.md")))
    if any(block == loop for block in code_blocks(readme)):
        return []
    return ["README.md: no code block is the loop of examples/minimal_amp.cpp (between its "
            f"'{LOOP_MARKER}' lines); paste it again:\n" + "\n".join(loop)]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    problems = reference_problems(root) + readme_loop_problems(root)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
