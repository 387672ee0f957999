"""build/tcf16_probe (bench/f16_bound_probe.c): the loops behind issue 16's
point 5. The other bfloat16 steps (bf16-intrnd, bf16-widen, bf16-ymm,
bf16-ochk, bf16-acc) must give the library step's bits (bf16-full), and
the AVX2 steps (a2-f16-step, a2-bf16-nonan) those of their reference
loops: the probe marks a line "(WRONG BITS)" when they do not. The
truncating a2-bf16-trunc must be marked "(truncated: other bits)": the
bits check sees a difference. Every line is "loop BYTES GB/s" with a
positive rate. Where the CPU lacks AVX2 or F16C the probe prints
"SKIP: ..."; the AVX-512 loops run only where the CPU has AVX-512."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(os.environ.get("TC_BUILD_DIR", ROOT / "build")) / "tcf16_probe"


@pytest.mark.skipif(not PROBE.exists(), reason="tcf16_probe is not built")
def test_f16_probe_lines_and_bits():
    r = subprocess.run([str(PROBE), "4096"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    if r.stdout.startswith("SKIP"):
        pytest.skip(r.stdout.strip())
    rows = [l.split() for l in r.stdout.splitlines() if l and not l.startswith("#")]
    assert rows, r.stdout
    assert "WRONG BITS" not in r.stdout, r.stdout
    names = set()
    for row in rows:
        if row[0] == "a2-bf16-trunc":
            assert row[3:] == ["(truncated:", "other", "bits)"], row
            row = row[:3]
        assert len(row) == 3 and row[1] == "4096" and float(row[2]) > 0, row
        names.add(row[0])
    assert {"a2-f16-bare", "a2-f16-step", "a2-bf16-step", "a2-bf16-nonan", "a2-bf16-trunc",
            "a2-f32"} <= names, names
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if all(f" {f}" in flags for f in ("avx512f", "avx512bw", "avx512dq", "avx512vl")):
        assert {"zmm-bare", "ymm-bare", "f32"} <= names, names
    if " avx512_bf16" in flags:
        assert {"bf16-full", "bf16-intrnd", "bf16-widen", "bf16-ymm", "bf16-ochk",
                "bf16-acc"} <= names, names
