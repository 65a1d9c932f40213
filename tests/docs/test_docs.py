"""Tests of tests/docs/check_docs.py: the repository's docs pass it, and made-up docs that point
at a missing file, past a file's end, at lines where the named code is not, or at a test that does
not exist fail it, as does a README loop that differs from examples/minimal_amp.cpp's. Standard
library only (ctest runs it as docs.check with the python3 that CMake found)."""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_docs  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

MINIMAL = """int main() {
  // the loop
  for (int step = 0; step < 3; ++step) {
    train(step);
  }
  // the loop
}
"""
SOURCE = "// one\nint scale_of(int x) {\n  return 2 * x;\n}\n"
TESTS = "TEST(Scaler, DoublesTheValue) {}\n"


class MadeUpRepo:
    """A folder with README.md, docs/tour.md, one source file, one test and minimal_amp.cpp."""

    def __init__(self, test, readme, tour=""):
        self.dir = tempfile.TemporaryDirectory()
        test.addCleanup(self.dir.cleanup)
        self.write("README.md", readme)
        self.write("docs/tour.md", tour)
        self.write("src/scale.cpp", SOURCE)
        self.write("tests/test_scale.cpp", TESTS)
        self.write("examples/minimal_amp.cpp", MINIMAL)

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def references(self):
        return check_docs.reference_problems(self.dir.name)

    def loop(self):
        return check_docs.readme_loop_problems(self.dir.name)


README_LOOP = "```cpp\nfor (int step = 0; step < 3; ++step) {\n  train(step);\n}\n```\n"


class TheRepository(unittest.TestCase):
    def test_every_reference_in_the_docs_holds(self):
        self.assertEqual(check_docs.reference_problems(ROOT), [])

    def test_the_readme_shows_the_loop_of_minimal_amp(self):
        self.assertEqual(check_docs.readme_loop_problems(ROOT), [])

    def test_the_tour_links_lines(self):
        with open(os.path.join(ROOT, "docs", "tour.md")) as f:
            self.assertGreater(len(check_docs.LINE_LINK.findall(f.read())), 20)


class References(unittest.TestCase):
    def test_links_to_the_named_lines_pass(self):
        tour = ("[`scale_of`](../src/scale.cpp#L2) and [`return`](../src/scale.cpp#L2-L3), "
                "`src/scale.cpp:4`, tested by `Scaler.DoublesTheValue`")
        self.assertEqual(MadeUpRepo(self, README_LOOP, tour).references(), [])

    def test_a_missing_file_fails(self):
        repo = MadeUpRepo(self, README_LOOP, "[`scale_of`](../src/gone.cpp#L2)")
        self.assertEqual(repo.references(), ["docs/tour.md: src/gone.cpp does not exist"])

    def test_lines_past_the_end_fail(self):
        repo = MadeUpRepo(self, README_LOOP, "`src/scale.cpp:3-9`")
        self.assertIn("outside its 4 lines", repo.references()[0])

    def test_a_name_that_moved_fails(self):
        repo = MadeUpRepo(self, README_LOOP, "[`scale_of`](../src/scale.cpp#L3)")
        self.assertEqual(repo.references(),
                         ["docs/tour.md: `scale_of` is not on src/scale.cpp:3-3"])

    def test_links_from_the_readme_are_relative_to_the_root(self):
        readme = README_LOOP + "[`scale_of`](src/scale.cpp#L2) [`x`](docs/tour.md#L9)"
        self.assertEqual(MadeUpRepo(self, readme).references(),
                         ["README.md: docs/tour.md:9-9 is outside its 0 lines"])

    def test_an_unknown_test_fails(self):
        repo = MadeUpRepo(self, README_LOOP, "`Scaler.HalvesTheValue`")
        self.assertEqual(repo.references(),
                         ["docs/tour.md: no test Scaler.HalvesTheValue under tests/"])


class ReadmeLoop(unittest.TestCase):
    def test_the_same_loop_passes(self):
        self.assertEqual(MadeUpRepo(self, "# x\n\n" + README_LOOP).loop(), [])

    def test_a_changed_line_fails(self):
        readme = README_LOOP.replace("train(step)", "train(step + 1)")
        self.assertIn("no code block is the loop", MadeUpRepo(self, readme).loop()[0])

    def test_missing_markers_fail(self):
        repo = MadeUpRepo(self, README_LOOP)
        repo.write("examples/minimal_amp.cpp", MINIMAL.replace("  // the loop\n}", "}"))
        self.assertIn("expected two", repo.loop()[0])


if __name__ == "__main__":
    unittest.main()
