"""`ggtool ops`: the registered ops with their C signature and description."""

from __future__ import annotations

import json

from conftest import fails, ok

from ggtool.ops import FUNCTIONS


def test_ops_table_lists_every_function(run):
    lines = ok(run("ops")).splitlines()
    assert len(lines) == len(FUNCTIONS)
    add = next(line for line in lines if line.split()[0] == "add")
    assert "ggml_add(ctx, a, b)" in add and FUNCTIONS["add"].doc in add


def test_ops_json(run):
    records = json.loads(ok(run("ops", "--json")))
    assert [r["name"] for r in records] == list(FUNCTIONS)
    add = next(r for r in records if r["name"] == "add")
    assert add == {"name": "add", "signature": "ggml_add(ctx, a, b)", "description": FUNCTIONS["add"].doc,
                   "params": ["a", "b"]}


def test_ops_pattern(run):
    names = [line.split()[0] for line in ok(run("ops", "reshape")).splitlines()]
    assert names and all("reshape" in n for n in names)
    fails(run("ops", "no_such_op"), "no op name contains 'no_such_op'")


def test_builtins_are_listed_apart_from_ops(run):
    out = ok(run("ops", "--builtins"))
    assert "input(name, type, ne0, ne1, ne2, ne3)" in out and "meta(key, default)" in out and "ggml_mul_mat" not in out
    assert "input(" not in ok(run("ops"))
