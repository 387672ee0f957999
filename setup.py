"""Builds torchcomms._comms: the extension's own python/torchcomms/_comms*.c
plus every library source under src/ (except the plugins src/backends/nccl/
and src/backends/mpi/),
compiled into the one module with hidden visibility; and the nccl backend
(src/backends/nccl/) as torchcomms/libtorchcomms-nccl.so beside it, where the
loader looks for backends ("beside libtorchcomms": here, beside the
extension). The mpi backend goes there too when an MPI compiler wrapper is
found (TORCHCOMMS_MPICC, else mpicc on PATH), built by
tools/build_mpi_plugin.sh; without one it is skipped with a notice.
Metadata: pyproject.toml.
"""
import os
import shutil
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def rel(paths):
    return sorted(str(p.relative_to(ROOT)) for p in paths)


lib_sources = [p for p in (ROOT / "src").rglob("*.c")
               if "backends/nccl" not in p.relative_to(ROOT).as_posix()
               and "backends/mpi" not in p.relative_to(ROOT).as_posix()]
ext_sources = list((ROOT / "python" / "torchcomms").glob("_comms*.c"))
nccl_sources = sorted((ROOT / "src" / "backends" / "nccl").glob("*.c"))
CFLAGS = ["-std=gnu11", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror",
          "-Wno-unused-parameter"]
# Small fixed-size clears as vector stores, not `rep stosq` (CMakeLists.txt
# says why); GCC only: added when the compiler accepts it.
MEMSET_FLAG = "-mmemset-strategy=vector_loop:1024:noalign,libcall:-1:noalign"
# Link-time optimisation of the extension (off with TORCHCOMMS_LTO=0).
LTO_FLAG = "-flto=auto"
headers = list((ROOT / "src").rglob("*.h")) + list((ROOT / "include").glob("*.h")) + \
    list((ROOT / "python" / "torchcomms").glob("_comms*.h"))


class BuildExt(build_ext):
    """Compiles the ~20 sources in parallel."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def run(self):
        super().run()
        self.build_nccl_backend()
        self.build_mpi_backend()

    def build_extensions(self):
        if self.compiler_accepts(MEMSET_FLAG):
            for e in self.extensions:
                e.extra_compile_args = list(e.extra_compile_args) + [MEMSET_FLAG]
        # optimised across files, as libtorchcomms.so is (CMakeLists.txt):
        # an 8-byte call runs some 15 % fewer instructions
        # (linked too: a GCC whose LTO plugin the system's ld cannot run
        # compiles with -flto but fails to link, "could not run lto-wrapper")
        if os.environ.get("TORCHCOMMS_LTO", "1") != "0" and \
                self.compiler_accepts(LTO_FLAG, link=True):
            for e in self.extensions:
                e.extra_compile_args = list(e.extra_compile_args) + [LTO_FLAG]
                e.extra_link_args = list(e.extra_link_args) + [LTO_FLAG, "-O3"]
        super().build_extensions()

    def compiler_accepts(self, flag, link=False):
        """Whether the compiler takes flag (and, with link, a shared object
        links with it, as the extension is linked)."""
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "probe.c")
            with open(src, "w") as f:
                f.write("int tc_probe(int x) { return x + 1; }\n")
            try:
                objs = self.compiler.compile([src], output_dir=d,
                                             extra_postargs=[flag, "-fPIC", "-Werror"])
                if link:
                    self.compiler.link_shared_object(
                        objs, os.path.join(d, "probe.so"), extra_postargs=[flag, "-O3"])
            except Exception:
                return False
        return True

    def build_mpi_backend(self):
        """libtorchcomms-mpi.so beside the extension, linked against the MPI
        of the wrapper found; skipped (with a notice) without one."""
        script = ROOT / "tools" / "build_mpi_plugin.sh"
        src = ROOT / "src" / "backends" / "mpi" / "mpi_backend.c"
        if not src.exists():
            return
        mpicc = os.environ.get("TORCHCOMMS_MPICC") or shutil.which("mpicc")
        if not mpicc:
            print("torchcomms: mpi backend skipped: no MPI compiler wrapper "
                  "(mpicc on PATH or TORCHCOMMS_MPICC)")
            return
        target = Path(self.get_ext_fullpath("torchcomms._comms")).parent / \
            "libtorchcomms-mpi.so"
        deps = [src, script, ROOT / "src" / "reduce" / "reduce.c"] + \
            list((ROOT / "include").glob("*.h"))
        if (not self.force and target.exists() and
                all(p.stat().st_mtime <= target.stat().st_mtime for p in deps)):
            return
        self.spawn([str(script), mpicc, str(target)])

    def build_nccl_backend(self):
        """libtorchcomms-nccl.so beside the extension. It links neither the
        library nor CUDA (NCCL and the CUDA runtime are dlopen'd), so it
        builds everywhere."""
        if not nccl_sources:
            return
        target = Path(self.get_ext_fullpath("torchcomms._comms")).parent / \
            "libtorchcomms-nccl.so"
        deps = nccl_sources + list((ROOT / "include").glob("*.h"))
        if (not self.force and target.exists() and
                all(p.stat().st_mtime <= target.stat().st_mtime for p in deps)):
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        objects = self.compiler.compile(
            rel(nccl_sources), output_dir=os.path.join(self.build_temp, "nccl"),
            macros=[("_GNU_SOURCE", None)], include_dirs=["include"],
            extra_postargs=CFLAGS)
        self.compiler.link_shared_object(
            objects, str(target), libraries=["dl", "pthread"],
            extra_postargs=["-Wl,--no-undefined"])


class BuildPy(build_py):
    """Starts from an empty build/.../torchcomms so that files deleted from
    python/torchcomms/ do not linger in later wheels."""

    def run(self):
        pkg = Path(self.build_lib) / "torchcomms"
        if pkg.is_dir():  # the extension stays: build_ext relinks only if stale
            for p in pkg.iterdir():
                if p.suffix != ".so":
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
        super().run()


comms = Extension(
    "torchcomms._comms",
    sources=rel(ext_sources) + rel(lib_sources),
    depends=rel(headers),
    include_dirs=["include", "src"],
    define_macros=[("_GNU_SOURCE", None)],
    extra_compile_args=CFLAGS,
    libraries=["dl", "m", "pthread"],
)

setup(
    ext_modules=[comms],
    cmdclass={"build_ext": BuildExt, "build_py": BuildPy},
    # keep setuptools' objects out of the CMake build tree's top level
    options={"build": {"build_base": "build/setuptools"}},
)
