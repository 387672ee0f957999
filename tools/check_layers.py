#!/usr/bin/env python3
"""check_layers.py -- checks every #include "..." of libtorchcomms, its tools
and its Python extension against the layer table below (the one source of
truth; docs/architecture.md explains it).

    python3 tools/check_layers.py [--root DIR]

Scans include/*.h, src/**/*.{c,h}, tools/*.{c,h} and python/torchcomms/*.{c,h}.
A file may include a header
  - of a lower layer, if that layer exports it (EXPORTS);
  - of its own layer, unless the header is private to some of the layer's
    files (PRIVATE) and the file is not one of them.
Anything else is a violation, printed as
    file:line: <layer> may not include <header> (<layer>)
and the exit status is 1 (0 when there is none). A file that belongs to no
layer, or an include that names no file of the tree, is a violation too, so
that a new directory or header is placed in the table when it is added.
Python 3 standard library only.
"""
import argparse
import fnmatch
import os
import re
import sys

# Layers, bottom to top: (name, globs of the files that belong to it). The
# first layer whose globs match a file is the file's layer.
LAYERS = [
    ("public", ["include/*.h"]),
    ("util", ["src/private_api.h", "src/core/internal.h", "src/core/error*.c",
              "src/core/clock*.c", "src/core/log*.c", "src/core/env*.c",
              "src/core/settings*", "src/core/library.c", "src/core/dtype.c",
              "src/reduce/*"]),
    ("bootstrap", ["src/bootstrap/*"]),
    ("transport", ["src/transport/*"]),
    ("backends", ["src/backends/*"]),
    ("core", ["src/core/*"]),
    ("tools", ["tools/*"]),
    ("extension", ["python/torchcomms/*"]),
]

# The headers of each layer that the layers above it may include.
EXPORTS = {
    "public": ["include/torchcomms.h", "include/torchcomms_backend.h"],
    "util": ["src/core/internal.h", "src/core/settings.h", "src/private_api.h"],
    "bootstrap": ["src/bootstrap/bootstrap.h"],
    "transport": ["src/transport/transport.h", "src/transport/tcp.h",
                  "src/transport/shm.h"],
    "backends": ["src/backends/builtin.h"],
    "core": [],
    "tools": [],
    "extension": [],
}

# Headers private to some files of their own layer: header glob -> globs of
# the files that may include it.
PRIVATE = {
    "src/transport/tcp_internal.h": ["src/transport/tcp*", "src/transport/mesh.c"],
    "src/transport/tcp_listen.h": ["src/transport/tcp*"],
    "src/transport/shm_internal.h": ["src/transport/shm*"],
    "src/backends/cpu/*.h": ["src/backends/cpu/*"],
    "src/backends/nccl/*.h": ["src/backends/nccl/*"],
}

# Files that may include fewer of the lower layers' exports: glob of the
# files -> globs of the lower-layer headers they may include. The nccl
# plugin is a separate shared object (public headers only); tcrun and the
# extension use the public headers and the one header deliberately shared
# with them (src/private_api.h), never a layer's internal header.
ONLY = {
    "src/backends/nccl/*": ["include/*"],
    "tools/*": ["include/*", "src/private_api.h"],
    "python/torchcomms/*": ["include/*", "src/private_api.h"],
}

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def match(path, globs):
    return any(fnmatch.fnmatchcase(path, g) for g in globs)


def layer_of(path):
    for i, (name, globs) in enumerate(LAYERS):
        if match(path, globs):
            return i, name
    return None, None


def scanned_files(root):
    """include/*.h, src/**/*.{c,h}, tools/*.{c,h}, python/torchcomms/*.{c,h}."""
    out = []
    for top, deep, exts in (("include", False, (".h",)), ("src", True, (".c", ".h")),
                            ("tools", False, (".c", ".h")),
                            ("python/torchcomms", False, (".c", ".h"))):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(dirnames) if deep else []
            for f in sorted(filenames):
                if f.endswith(exts):
                    out.append(os.path.relpath(os.path.join(dirpath, f), root)
                               .replace(os.sep, "/"))
    return out


def resolve(root, src, name):
    """The repository path of the header `name` included by `src`, or None:
    as the build finds it: beside the file, then under src/, then include/."""
    for base in (os.path.dirname(src), "src", "include"):
        cand = os.path.normpath(os.path.join(base, name)).replace(os.sep, "/")
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def allowed(src, src_layer, hdr, hdr_layer):
    si, sname = src_layer
    hi, hname = hdr_layer
    if hi is None:
        return False
    if hi > si:
        return False
    if hi < si:
        for files, headers in ONLY.items():
            if fnmatch.fnmatchcase(src, files) and not match(hdr, headers):
                return False
        return hdr in EXPORTS.get(hname, [])
    for pattern, who in PRIVATE.items():
        if fnmatch.fnmatchcase(hdr, pattern) and not match(src, who):
            return False
    return True


def check(root):
    problems = []
    for src in scanned_files(root):
        sl = layer_of(src)
        if sl[0] is None:
            problems.append(f"{src}:1: {src} belongs to no layer (add it to "
                            f"LAYERS in tools/check_layers.py)")
            continue
        with open(os.path.join(root, src), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                hdr = resolve(root, src, m.group(1))
                if hdr is None:
                    problems.append(f"{src}:{lineno}: {sl[1]} may not include "
                                    f"{m.group(1)} (no such header in the tree)")
                    continue
                hl = layer_of(hdr)
                if not allowed(src, sl, hdr, hl):
                    problems.append(f"{src}:{lineno}: {sl[1]} may not include "
                                    f"{hdr} ({hl[1] or 'no layer'})")
    return problems


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), help="repository root (default: this checkout)")
    args = ap.parse_args(argv)
    problems = check(args.root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) against the layer order "
              f"(docs/architecture.md)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
