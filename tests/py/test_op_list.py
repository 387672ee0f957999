"""The one list of operations (TC_OP_MAP in include/torchcomms.h) and the
hand-written lists that must agree with it.

The C enum, names, flags, backend kinds and the extension's method table are
generated from the list (a missing binding does not compile). What is still
written by hand is checked here: the type stub `_comms.pyi` must declare every
operation of TC_COMM_OP_MAP as a TorchComm method, the extension must expose
it (tests/c/test_op_list.c checks the C side: names, flags, kinds).

Run: .venv/bin/python -m pytest -q tests/py/test_op_list.py
"""
import ast
import os
import re

import pytest

from torchcomms import _comms

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _map(macro):
    """(ID, name, kind) of every X(...) line of `macro` in torchcomms.h."""
    text = open(os.path.join(ROOT, "include", "torchcomms.h")).read()
    m = re.search(r"#define %s\(X\)(.*?)(?:\n\n|\n#define)" % macro, text, re.S)
    assert m, "no %s in torchcomms.h" % macro
    return re.findall(r"X\((\w+),\s*(\w+),\s*(\w+),", m.group(1))


def test_the_list_parses():
    ops = _map("TC_COMM_OP_MAP")
    names = [n for _, n, _ in ops]
    assert len(names) == 18 and len(set(names)) == 18
    assert "all_to_all_v_single" in names
    for op_id, name, _ in ops:
        assert op_id.lower() == name  # TC_OP_<ID> is the name in upper case


def _pyi_methods():
    tree = ast.parse(open(os.path.join(ROOT, "python", "torchcomms", "_comms.pyi")).read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TorchComm":
            return {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    pytest.fail("_comms.pyi has no class TorchComm")


def test_stub_declares_every_operation():
    methods = _pyi_methods()
    missing = [n for _, n, _ in _map("TC_COMM_OP_MAP") if n not in methods]
    assert not missing, "_comms.pyi lacks TorchComm methods for %s" % missing


def test_extension_exposes_every_operation():
    missing = [n for _, n, _ in _map("TC_COMM_OP_MAP")
               if not callable(getattr(_comms.TorchComm, n, None))]
    assert not missing, missing
    # the docstring comes from the binding's tcpy_doc_<name>
    for _, n, _ in _map("TC_COMM_OP_MAP"):
        assert getattr(_comms.TorchComm, n).__doc__.startswith(n + "("), n
