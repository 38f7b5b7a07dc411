"""Tests of scripts/source-mtimes on throwaway git repositories: a clone gets the recorded
mtimes of its unchanged files, a changed file keeps its own, and nothing is restored when
a build wrote the target dir after the record."""

import os
import subprocess
import tempfile
import time
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "source-mtimes")
OLD_NS = 1_600_000_000 * 10**9  # 2020: older than any build


def git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


def run(cwd, *args):
    proc = subprocess.run([SCRIPT, *args], cwd=cwd, check=True, capture_output=True, text=True)
    return proc.stdout


class SourceMtimes(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        root = self.tmp.name
        self.origin = os.path.join(root, "origin")
        self.target = os.path.join(root, "target")
        os.makedirs(os.path.join(self.origin, "src"))
        for name in ("src/a.rs", "src/b.rs"):
            with open(os.path.join(self.origin, name), "w") as out:
                out.write(name)
        git(self.origin, "init", "-q")
        git(self.origin, "add", ".")
        git(self.origin, "commit", "-qm", "one")
        # The tree that built last: its files are old, its build (a fingerprint) is
        # newer, and the record comes after the build.
        self.built = self.clone("built")
        for name in ("src/a.rs", "src/b.rs"):
            os.utime(os.path.join(self.built, name), ns=(OLD_NS, OLD_NS))
        os.makedirs(os.path.join(self.target, "debug", ".fingerprint", "a-1"))
        with open(os.path.join(self.target, "debug", ".fingerprint", "a-1", "lib-a"), "w") as out:
            out.write("x")
        time.sleep(0.01)
        run(self.built, "save", self.target)

    def tearDown(self):
        self.tmp.cleanup()

    def clone(self, name):
        path = os.path.join(self.tmp.name, name)
        git(self.tmp.name, "clone", "-q", self.origin, path)
        return path

    def mtime(self, tree, name):
        return os.stat(os.path.join(tree, name)).st_mtime_ns

    def test_a_clone_of_the_same_sources_gets_the_recorded_mtimes(self):
        fresh = self.clone("fresh")
        self.assertNotEqual(self.mtime(fresh, "src/a.rs"), OLD_NS)
        out = run(fresh, "restore", self.target)
        self.assertIn("2 files as recorded", out)
        self.assertEqual(self.mtime(fresh, "src/a.rs"), OLD_NS)
        self.assertEqual(self.mtime(fresh, "src/b.rs"), OLD_NS)

    def test_a_changed_file_keeps_its_new_mtime(self):
        with open(os.path.join(self.origin, "src/b.rs"), "w") as out:
            out.write("changed")
        git(self.origin, "commit", "-qam", "two")
        fresh = self.clone("fresh")
        out = run(fresh, "restore", self.target)
        self.assertIn("1 files as recorded", out)
        self.assertIn("1 new or changed", out)
        self.assertEqual(self.mtime(fresh, "src/a.rs"), OLD_NS)
        self.assertGreater(self.mtime(fresh, "src/b.rs"), OLD_NS)

    def test_nothing_is_restored_after_a_build_the_record_does_not_describe(self):
        later = os.path.join(self.target, "debug", ".fingerprint", "a-2")
        os.makedirs(later)
        with open(os.path.join(later, "lib-a"), "w") as out:
            out.write("another tree's build")
        future = time.time_ns() + 10**9
        os.utime(later, ns=(future, future))
        fresh = self.clone("fresh")
        out = run(fresh, "restore", self.target)
        self.assertIn("nothing restored", out)
        self.assertGreater(self.mtime(fresh, "src/a.rs"), OLD_NS)

    def test_uncommitted_changes_are_neither_recorded_nor_restored(self):
        with open(os.path.join(self.built, "src/a.rs"), "w") as out:
            out.write("edited, not committed")
        run(self.built, "save", self.target)
        fresh = self.clone("fresh")
        out = run(fresh, "restore", self.target)
        self.assertIn("1 files as recorded", out)
        self.assertGreater(self.mtime(fresh, "src/a.rs"), OLD_NS)

    def test_sources_that_tie_a_build_to_its_tree_are_refused_by_name(self):
        files = {
            "pkg/Cargo.toml": "[package]\n",
            "pkg/src/lib.rs": 'const A: &str = include_str!("../data/inside.txt");\n',
            "pkg/data/inside.txt": "inside the package\n",
            "pkg/tests/golden.rs": 'fn dir() -> &\'static str { env!("CARGO_MANIFEST_DIR") }\n',
            "pkg/src/docs.rs": '\n\nconst D: &str = include_str!("../../docs/x.md");\n',
        }
        for name, text in files.items():
            os.makedirs(os.path.join(self.origin, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(self.origin, name), "w") as out:
                out.write(text)
        git(self.origin, "add", ".")
        git(self.origin, "commit", "-qm", "tree-bound")
        fresh = self.clone("fresh")
        for command in ("restore", "save"):
            proc = subprocess.run([SCRIPT, command, self.target], cwd=fresh,
                                  capture_output=True, text=True)
            self.assertEqual(proc.returncode, 1, proc.stderr)
            self.assertIn("pkg/tests/golden.rs:1: env!", proc.stderr)
            self.assertIn("pkg/src/docs.rs:3: includes ../../docs/x.md, outside its package",
                          proc.stderr)
            self.assertNotIn("lib.rs", proc.stderr)
        # Refused before touching anything: the clone keeps its own mtimes.
        self.assertGreater(self.mtime(fresh, "src/a.rs"), OLD_NS)


if __name__ == "__main__":
    unittest.main()
