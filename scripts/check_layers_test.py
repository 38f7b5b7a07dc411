"""Tests of scripts/check-layers, run by `scripts/check-layers --self-test`.

Two kinds: a small synthetic workspace whose imports each test changes, and a copy of
this repository's own tree, which must pass as it is and fail once a back-import is
planted in it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import shutil
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

SCRIPT: Path
REPO: Path


def _load():
    loader = importlib.machinery.SourceFileLoader("check_layers", str(SCRIPT))
    spec = importlib.util.spec_from_loader("check_layers", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_layers"] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


LAYERS = """\
# Architecture

```layers
[a/src/lib.rs]
3: high
2: mid mid/child
1: lib low
forbid low: tonic crate::mid
```
"""


class Synthetic(unittest.TestCase):
    """A workspace of one crate: lib declares low, mid (a folder with a child), high."""

    def setUp(self):
        self.cl = _load()
        self.dir = Path(tempfile.mkdtemp(prefix="check-layers-"))
        self.write("Cargo.toml", '[workspace]\nmembers = ["a"]\n')
        self.write("a/Cargo.toml", '[package]\nname = "a"\n')
        self.write("docs/architecture.md", LAYERS)
        self.write("a/src/lib.rs", "pub mod high;\npub mod low;\npub mod mid;\n")
        self.write("a/src/low.rs", "pub struct Low;\n")
        self.write("a/src/mid/mod.rs", "pub mod child;\npub use child::Child;\npub struct Mid;\n")
        self.write("a/src/mid/child.rs", "use crate::low::Low;\npub struct Child(pub Low);\n")
        self.write(
            "a/src/high.rs",
            "use crate::mid::{self, Child};\npub fn f(_: Child) -> mid::Mid { mid::Mid }\n",
        )

    def tearDown(self):
        shutil.rmtree(self.dir)

    def write(self, path, text):
        file = self.dir / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(textwrap.dedent(text))

    def append(self, path, text):
        file = self.dir / path
        file.write_text(file.read_text() + textwrap.dedent(text))

    def problems(self):
        return self.cl.check(self.dir)

    def test_the_layered_tree_passes(self):
        self.assertEqual(self.problems(), [])

    def test_a_back_import_is_an_arrow_up_and_a_circle(self):
        self.append("a/src/mid/child.rs", "pub fn g() -> crate::high::Unit { todo!() }\n")
        problems = "\n".join(self.problems())
        self.assertIn("arrow up: mid/child (floor 2) imports high (floor 3)", problems)
        self.assertIn("circle in a/src/lib.rs of 2 modules: high, mid/child", problems)

    def test_nested_use_trees_renames_and_super_chains_are_read(self):
        self.append("a/src/low.rs", "use crate::{mid::{Mid as M}};\n")
        self.append("a/src/mid/child.rs", "use super::super::high as h;\n")
        problems = "\n".join(self.problems())
        self.assertIn("arrow up: low (floor 1) imports mid (floor 2)", problems)
        self.assertIn("arrow up: mid/child (floor 2) imports high (floor 3)", problems)

    def test_an_import_through_a_re_export_reaches_the_defining_module(self):
        # `mid` re-exports `Child`; `low` naming `crate::mid::Child` imports mid/child.
        self.append("a/src/low.rs", "pub fn c(_: crate::mid::Child) {}\n")
        problems = "\n".join(self.problems())
        self.assertIn("low (floor 1) imports mid/child (floor 2)", problems)

    def test_test_code_comments_strings_and_visibility_are_no_imports(self):
        self.append(
            "a/src/low.rs",
            """\
            // use crate::high::X;
            /* crate::high::Y /* nested */ crate::high::Z */
            pub const S: &str = "crate::high::Q";
            pub const R: &str = r#"use crate::high::W; "quoted""#;
            pub const C: char = '"';
            pub(in crate::low) fn private() {}
            #[cfg(test)]
            mod tests {
                use crate::high::f;
            }
            #[cfg(test)]
            use crate::high::f as g;
            """,
        )
        self.assertEqual(self.problems(), [])

    def test_a_forbidden_outside_path_or_module_fails(self):
        self.append("a/src/low.rs", "pub fn s() -> tonic::Status { todo!() }\n")
        problems = "\n".join(self.problems())
        self.assertIn("low imports `tonic::Status`, forbidden", problems)

    def test_an_only_line_allows_nothing_else_of_the_crate(self):
        self.write(
            "docs/architecture.md", LAYERS.replace("forbid low", "only mid/child: crate::mid\nforbid low")
        )
        problems = "\n".join(self.problems())
        self.assertIn("mid/child imports low (`crate::low::Low`)", problems)
        self.assertIn("allows only crate::mid", problems)

    def test_a_module_without_a_floor_fails(self):
        self.append("a/src/lib.rs", "pub mod extra;\n")
        self.write("a/src/extra.rs", "pub struct E;\n")
        self.assertIn("module extra has no floor", "\n".join(self.problems()))

    def test_a_known_circle_must_still_be_one(self):
        self.write(
            "docs/architecture.md",
            LAYERS.replace("forbid low", "known circle: mid mid/child\nforbid low"),
        )
        self.assertIn("known circle mid mid/child is not a circle", "\n".join(self.problems()))


class RealTree(unittest.TestCase):
    """This repository's tree, copied: it passes, and fails with a planted back-import."""

    def setUp(self):
        self.cl = _load()
        self.dir = Path(tempfile.mkdtemp(prefix="check-layers-real-"))
        shutil.copy(REPO / "Cargo.toml", self.dir / "Cargo.toml")
        (self.dir / "docs").mkdir()
        shutil.copy(REPO / "docs/architecture.md", self.dir / "docs/architecture.md")
        for member in ("crds", "cache-node", "operator"):
            shutil.copytree(REPO / member / "src", self.dir / member / "src")
            shutil.copy(REPO / member / "Cargo.toml", self.dir / member / "Cargo.toml")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def plant(self, path, line):
        file = self.dir / path
        text = file.read_text()
        # after the module's doc comment, as a real import would stand
        head, _, body = text.partition("\nuse ")
        file.write_text(f"{head}\n{line}\nuse {body}" if body else f"{text}\n{line}\n")

    def test_the_tree_passes_as_it_is(self):
        self.assertEqual(self.cl.check(self.dir), [])

    def test_a_store_module_importing_the_server_fails(self):
        self.plant("cache-node/src/store/clock.rs", "use crate::server::RunningNode;")
        problems = "\n".join(self.cl.check(self.dir))
        self.assertIn("cache-node/src/store/clock.rs: arrow up: store/clock (floor 1)", problems)
        self.assertRegex(problems, r"store/clock \(floor 1\) imports server \(floor \d+\)")
        self.assertIn("circle in cache-node/src/lib.rs", problems)

    def test_error_importing_the_cluster_layer_again_fails(self):
        self.plant("cache-node/src/error.rs", "use crate::cluster::lease::Leases;")
        problems = "\n".join(self.cl.check(self.dir))
        self.assertRegex(problems, r"arrow up: error \(floor \d+\) imports cluster/lease")
        self.assertIn("error imports crate::cluster", problems)

    def test_the_store_importing_tonic_fails(self):
        self.plant("cache-node/src/store/weight.rs", "use tonic::Status;")
        problems = "\n".join(self.cl.check(self.dir))
        self.assertIn("store/weight imports `tonic::Status`, forbidden", problems)

    def test_an_operator_builder_importing_apply_fails(self):
        self.plant("operator/src/build/names.rs", "use crate::apply::apply_cluster;")
        problems = "\n".join(self.cl.check(self.dir))
        self.assertRegex(problems, r"arrow up: build/names \(floor 1\) imports apply \(floor \d+\)")

    def test_the_planner_importing_the_node_client_fails(self):
        self.plant("operator/src/plan.rs", "use crate::nodes::NodeAdmin;")
        problems = "\n".join(self.cl.check(self.dir))
        self.assertIn("plan imports crate::nodes (`crate::nodes::NodeAdmin`), forbidden", problems)

    def test_execute_importing_the_controller_again_is_a_circle(self):
        self.plant("operator/src/execute.rs", "use crate::controller::reconcile;")
        problems = "\n".join(self.cl.check(self.dir))
        self.assertIn("circle in operator/src/lib.rs", problems)
        self.assertRegex(problems, r"arrow up: execute \(floor \d+\) imports controller")

    def test_the_crd_defaults_naming_a_crd_type_again_fails(self):
        self.plant("crds/src/cachecluster/defaults.rs", "use super::pool::WhenUnsatisfiable;")
        problems = "\n".join(self.cl.check(self.dir))
        self.assertIn("circle in crds/src/lib.rs", problems)


def load_tests_for(script: Path, repo: Path) -> unittest.TestSuite:
    global SCRIPT, REPO
    SCRIPT, REPO = script, repo
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    suite.addTests(loader.loadTestsFromTestCase(Synthetic))
    suite.addTests(loader.loadTestsFromTestCase(RealTree))
    return suite
