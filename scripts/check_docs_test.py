"""Tests of scripts/check-docs on a small synthetic repository: each dangling name is
reported with its file and line, and what exists passes. `python -m pytest -q
scripts/check_docs_test.py`."""

import importlib.machinery
import importlib.util
import os

LOADER = importlib.machinery.SourceFileLoader(
    "check_docs", os.path.join(os.path.dirname(__file__), "check-docs"))
SPEC = importlib.util.spec_from_loader("check_docs", LOADER)
check_docs = importlib.util.module_from_spec(SPEC)
LOADER.exec_module(check_docs)


def repo(tmp_path, doc: str):
    files = {
        "README.md": doc,
        "docs/guide.md": "see [the readme](../README.md)\n",
        "cache-node/src/lib.rs": "pub mod wire;\npub mod client;\npub struct Root;\n",
        "cache-node/src/wire/mod.rs": "pub mod seal;\npub use seal::Sealed;\n",
        "cache-node/src/wire/seal.rs": "pub struct Sealed;\nimpl Sealed { pub fn seal() {} }\n"
                                       "pub enum Kind {\n    Plain,\n    Encoded,\n}\n",
        "cache-node/src/client.rs": "pub fn connection_lost() -> bool { true }\n"
                                    "pub const LIMIT: u32 = 4;\n",
        "cache-node/src/store/mod.rs": "mod sealed;\n",
        "e2e/tests/changes": "#!/bin/sh\n",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return check_docs.check(str(tmp_path))


def test_what_exists_passes(tmp_path):
    doc = ("Run `e2e/tests/changes --fast`; see [guide](docs/guide.md#top), `wire/seal.rs`,\n"
           "`cache_node::client::connection_lost`, `wire::seal::Sealed::seal`, "
           "`wire::Sealed`, `wire::seal::Kind::Plain`, `client::LIMIT`, `cache_node::Root`,\n"
           "`std::sync::Arc`, `apps/v1`, `/var/lib/kubelet`, `$STATE/logs/x.log`, `<pool>/x.rs`.\n"
           "```\nnot/checked.rs in a fence\n```\n")
    assert repo(tmp_path, doc) == []


def test_each_dangling_name_is_reported_where_it_is(tmp_path):
    doc = ("line one\n"
           "`e2e/tests/gone` and [old](docs/old.md)\n"
           "`flight/passthrough.rs`\n"
           "`store::wire`, `cache_node::client::retry_everything`, `wire::seal::Missing`\n")
    problems = repo(tmp_path, doc)
    assert [p.split(":")[1] for p in problems] == ["2", "2", "3", "4", "4", "4"], problems
    text = "\n".join(problems)
    for name in ["e2e/tests/gone", "docs/old.md", "flight/passthrough.rs", "store::wire",
                 "retry_everything", "Missing"]:
        assert name in text, (name, text)


def test_links_inside_code_spans_are_not_links(tmp_path):
    doc = "pattern `[a-z]([-a-z0-9]*[a-z0-9])?` is a regex\n"
    assert repo(tmp_path, doc) == []
