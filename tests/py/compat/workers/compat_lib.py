"""The worker side of tests/py/compat: parts run in order on every rank,
each checked exactly; each rank writes OUTDIR/rank<r>.json.

    from compat_lib import Worker
    w = Worker()                      # OUTDIR from argv[1]; rank/size from torchrun

    @w.part("split_dup_ranks")
    def _(c):                         # c: the Worker (checks, figures)
        c.eq("rank", comm.get_rank(), w.rank)
        with c.raises(RuntimeError, "duplicate"):
            comm.split([0, 0], "x")

    w.finish()                        # writes the result; exit status 0/1

A part that raises is recorded as an error (with the traceback) and the
next part runs; parts must not leave peers waiting (use timeouts).
"""

import json
import os
import re
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path


def _short(x, n=200):
    s = repr(x)
    return s if len(s) <= n else s[:n] + "..."


class Worker:
    def __init__(self, outdir=None):
        self.outdir = Path(outdir or sys.argv[1])
        self.rank = int(os.environ.get("RANK", "0"))
        self.size = int(os.environ.get("WORLD_SIZE", "1"))
        self.errors, self.figures, self.parts = [], {}, []
        self.checks = 0
        self.current = ""

    # ---- checks ----
    def fail(self, msg):
        self.errors.append(f"[{self.current}] {msg}")

    def eq(self, what, got, exp):
        self.checks += 1
        try:
            import torch
            if isinstance(got, torch.Tensor) or isinstance(exp, torch.Tensor):
                exp_t = exp if isinstance(exp, torch.Tensor) else torch.tensor(exp)
                ok = (isinstance(got, torch.Tensor) and got.shape == exp_t.shape
                      and got.dtype == exp_t.dtype and torch.equal(got, exp_t))
            else:
                ok = got == exp
        except ImportError:
            ok = got == exp
        if not ok:
            self.fail(f"{what}: got {_short(got)} expected {_short(exp)}")
        return ok

    def close(self, what, got, exp, atol):
        """max |got - exp| <= atol (tensors); records the difference."""
        self.checks += 1
        diff = (got.detach().double() - exp.detach().double()).abs().max().item() \
            if got.numel() else 0.0
        if got.shape != exp.shape or not diff <= atol:
            self.fail(f"{what}: max |diff| {diff} > {atol} (shapes {tuple(got.shape)} "
                      f"vs {tuple(exp.shape)})")
        return diff

    def true(self, what, cond):
        self.checks += 1
        if not cond:
            self.fail(what)
        return cond

    @contextmanager
    def raises(self, exc_type, match=None):
        """The block must raise exc_type (exactly that class or a subclass)
        whose message matches the regular expression `match`."""
        self.checks += 1
        try:
            yield
        except exc_type as e:
            if match and not re.search(match, str(e)):
                self.fail(f"{exc_type.__name__} raised, message {str(e)!r} "
                          f"does not match {match!r}")
        except BaseException as e:  # noqa: BLE001 - recorded
            self.fail(f"expected {exc_type.__name__}, got {type(e).__name__}: {e}")
        else:
            self.fail(f"expected {exc_type.__name__}, nothing raised")

    # ---- parts ----
    def part(self, name):
        def deco(fn):
            self.current = name
            n0 = len(self.errors)
            try:
                fn(self)
            except BaseException as e:  # noqa: BLE001 - recorded
                self.fail(f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}")
            if len(self.errors) == n0:
                self.parts.append(name)
            self.current = ""
            return fn
        return deco

    def finish(self):
        self.figures["checks"] = self.checks
        out = {"errors": self.errors, "figures": self.figures, "parts": self.parts}
        self.outdir.mkdir(parents=True, exist_ok=True)
        (self.outdir / f"rank{self.rank}.json").write_text(json.dumps(out, default=str))
        print(f"rank {self.rank}: {len(self.parts)} parts ok, {len(self.errors)} errors, "
              f"{self.checks} checks", flush=True)
        for e in self.errors[:5]:
            print(f"rank {self.rank}: {e}", file=sys.stderr, flush=True)
        return 0 if not self.errors else 1
