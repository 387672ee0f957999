"""tools/check_layers.py: the tree passes it, and it fails (exit 1, the
documented message) on a copy of the tree given a downward-only violation,
a private header included from outside, or an internal header included by
the extension.

Run: .venv/bin/python -m pytest -q tests/py/test_check_layers.py
"""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "check_layers.py"


def run(root):
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)],
                          capture_output=True, text=True, timeout=60)


def copy_tree(tmp_path):
    dst = tmp_path / "repo"
    for d in ("include", "src", "tools"):
        shutil.copytree(ROOT / d, dst / d)
    (dst / "python" / "torchcomms").mkdir(parents=True)
    for f in (ROOT / "python" / "torchcomms").glob("*.[ch]"):
        shutil.copy(f, dst / "python" / "torchcomms" / f.name)
    return dst


def add_include(path, header):
    text = path.read_text()
    path.write_text(f'#include "{header}"\n' + text)


def test_tree_passes():
    p = run(ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout == ""


def test_copy_passes_then_fails_on_bad_includes(tmp_path):
    repo = copy_tree(tmp_path)
    p = run(repo)
    assert p.returncode == 0, p.stdout + p.stderr
    add_include(repo / "src" / "bootstrap" / "kv.c", "core/core.h")
    add_include(repo / "src" / "core" / "loader.c", "backends/cpu/cpu.h")
    add_include(repo / "src" / "transport" / "shm.c", "transport/tcp_internal.h")
    add_include(repo / "python" / "torchcomms" / "_comms_ops.c", "core/internal.h")
    add_include(repo / "tools" / "tcrun.c", "nope/missing.h")
    p = run(repo)
    assert p.returncode == 1, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines == [
        "src/bootstrap/kv.c:1: bootstrap may not include src/core/core.h (core)",
        "src/core/loader.c:1: core may not include src/backends/cpu/cpu.h (backends)",
        "src/transport/shm.c:1: transport may not include "
        "src/transport/tcp_internal.h (transport)",
        "tools/tcrun.c:1: tools may not include nope/missing.h (no such header in the tree)",
        "python/torchcomms/_comms_ops.c:1: extension may not include "
        "src/core/internal.h (util)",
    ], p.stdout
    assert "5 include(s)" in p.stderr


def test_unplaced_file_fails(tmp_path):
    repo = copy_tree(tmp_path)
    (repo / "src" / "newdir").mkdir()
    (repo / "src" / "newdir" / "x.c").write_text('#include "torchcomms.h"\n')
    p = run(repo)
    assert p.returncode == 1
    assert "src/newdir/x.c:1: src/newdir/x.c belongs to no layer" in p.stdout
