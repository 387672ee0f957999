"""The PyPI-wheel anchors of `make bench` (issue 16): Open MPI 5, MPICH 5,
Intel MPI and oneCCL, run by ../shared/bench/anchors/run_anchor.sh (read its
README), plus bench/mpi_sendrecv.c (the MPI anchors) and bench/ccl_sendrecv.cpp
(the oneCCL ones) for send/recv, which the anchor script does not measure. Used by bench/run_bench.py; see docs/benchmarks.md.

Implementations: an anchor A is measured as "A" (shared memory, the
script's default) and "A-tcp" (the script's `tcp` argument).

The install cache is $ANCHOR_CACHE, default /tmp/anchor-cache: the script's
own default, so that a point reproduced by hand with run_anchor.sh uses the
same installs, and one cache (~800 MB) serves every checkout and worktree of
the project on this machine. It is filled once (prepare(): a warm-up call per
anchor before any timing) and reused by later runs.
"""
import os
import subprocess

KNOWN = ["ompi", "mpich", "impi", "ccl", "ccl-mpi", "ccl-impi"]
DEFAULT = "ompi,mpich,impi,ccl"
LABEL = {"ompi": "Open MPI 5.0.11", "mpich": "MPICH 5.0.2", "impi": "Intel MPI 2021.19",
         "ccl": "oneCCL 2022.2.0 (ATL ofi)", "ccl-mpi": "oneCCL 2022.2.0 (ATL mpi, MPICH)",
         "ccl-impi": "oneCCL 2022.2.0 (ATL mpi, Intel MPI)"}
# Anchors that busy-poll: with more ranks than cores they collapse to
# scheduler time slices (ms per call; the anchors' README). Open MPI
# (--oversubscribe: yields) and Intel MPI stay usable and are kept.
BUSY_POLL = {"mpich", "ccl", "ccl-mpi", "ccl-impi"}
# the anchors send_recv is measured for: bench/mpi_sendrecv.c built with each
# MPI, bench/ccl_sendrecv.cpp (ccl::send + ccl::recv) with oneCCL (ccl_perf.cpp
# has no point-to-point mode)
P2P = {"ompi", "mpich", "impi", "ccl", "ccl-mpi", "ccl-impi"}
PREFIX = {"ompi": "openmpi-5.0.11", "mpich": "mpich-5.0.2", "impi": "impi-2021.19.0",
          "ccl": "oneccl-cpu-2022.2.0"}
INSTALL_TIMEOUT = int(os.environ.get("BENCH_ANCHOR_INSTALL_TIMEOUT", "1800"))
RUN_TIMEOUT = int(os.environ.get("BENCH_ANCHOR_TIMEOUT", "600"))


def cache():
    return os.environ.get("ANCHOR_CACHE", "/tmp/anchor-cache")


def script(anchors_dir):
    return os.path.join(anchors_dir, "anchors", "run_anchor.sh")


def parse_list(text):
    """BENCH_ANCHORS / --anchors: comma separated; "" or "none" for none."""
    names = [a.strip() for a in (text or "").split(",") if a.strip() and a.strip() != "none"]
    bad = [a for a in names if a not in KNOWN]
    if bad:
        raise ValueError(f"unknown anchor(s) {', '.join(bad)} (known: {', '.join(KNOWN)})")
    return list(dict.fromkeys(names))


def impl_names(anchors):
    """The implementations the anchors add, interleaved shm / tcp."""
    return [x for a in anchors for x in (a, a + "-tcp")]


def split_impl(impl):
    """"ompi-tcp" -> ("ompi", True); "ccl-mpi" -> ("ccl-mpi", False); None if not an anchor."""
    if impl in KNOWN:
        return impl, False
    if impl.endswith("-tcp") and impl[:-4] in KNOWN:
        return impl[:-4], True
    return None


def _env():
    # not OMP_NUM_THREADS: GNU nproc honours it, and run_anchor.sh counts the
    # cores with nproc (its OVERSUBSCRIBED rule and its throttling settings)
    e = dict(os.environ, ANCHOR_CACHE=cache())
    e.pop("OMP_NUM_THREADS", None)
    return e


def _why(p_out, p_err, rc):
    lines = [ln.strip() for ln in (p_err + "\n" + p_out).splitlines() if ln.strip() and not ln.startswith("#")]
    return f"exit {rc}: " + (" | ".join(lines[-3:]) if lines else "no output")


def prepare(anchors, anchors_dir, log):
    """Installs (first use: pip download + install into the cache) and checks
    each anchor with one 8 B all_reduce at 2 ranks, untimed, and builds
    bench/mpi_sendrecv.c with each MPI anchor's compiler. Returns
    ({anchor: None (ready) or the reason it is skipped}, {anchor: sendrecv binary})."""
    sh = script(anchors_dir)
    status, p2p = {}, {}
    if not os.access(sh, os.X_OK):
        return {a: f"{sh} is missing (TC_BENCH_ANCHORS=/path/to/shared/bench)" for a in anchors}, p2p
    for a in anchors:
        log(f"bench: anchor {a}: install/check in {cache()} (first use downloads ~220 MB of wheels once)")
        try:
            p = subprocess.run([sh, a, "all_reduce", "2", "8", "8"], env=dict(_env(), ANCHOR_TIMEOUT="300"),
                               capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
            ok = p.returncode == 0 and any(ln.split()[:1] == ["8"] for ln in p.stdout.splitlines())
            status[a] = None if ok else _why(p.stdout, p.stderr, p.returncode)
        except (subprocess.TimeoutExpired, OSError) as e:
            status[a] = f"{type(e).__name__}: {e}"
        if status[a] is None and a in P2P:
            exe = build_sendrecv(a)
            if isinstance(exe, str) and os.access(exe, os.X_OK):
                p2p[a] = exe
            else:
                log(f"bench: anchor {a}: send_recv skipped: {exe[1]}")
        log(f"bench: anchor {a}: " + ("ready" if status[a] is None else f"SKIPPED ({status[a]})"))
    return status, p2p


def build_sendrecv(a):
    """bench/mpi_sendrecv.c built with anchor a's MPI (as run_anchor.sh builds
    mpi_perf.c), or bench/ccl_sendrecv.cpp with oneCCL for the ccl anchors (as
    it builds ccl_perf.cpp: against MPICH, or Intel MPI for ccl-impi), into the
    cache's bin/; rebuilt when the source is newer. Returns the path, or
    (None, why)."""
    here = os.path.dirname(os.path.abspath(__file__))
    c = cache()
    i, m = os.path.join(c, PREFIX["impi"]), os.path.join(c, PREFIX["mpich"])
    if a.startswith("ccl"):
        src = os.path.join(here, "ccl_sendrecv.cpp")
        lib = i if a == "ccl-impi" else m
        exe = os.path.join(c, "bin", "ccl_sendrecv_impi" if a == "ccl-impi" else "ccl_sendrecv")
        ccl = os.path.join(c, PREFIX["ccl"])
        cmd = ["c++", "-O2", "-std=c++17", f"-I{ccl}/include", f"-I{m}/include", "-o", exe, src,
               f"-L{ccl}/lib", "-lccl", f"-L{lib}/lib", "-lmpi", f"-Wl,-rpath,{ccl}/lib:{lib}/lib"]
    else:
        src = os.path.join(here, "mpi_sendrecv.c")
        exe = os.path.join(c, "bin", f"mpi_sendrecv_{a}")
        if a == "impi":  # the MPICH ABI: MPICH's mpi.h, Intel MPI's libmpi.so.12
            cmd = ["cc", "-O2", f"-I{m}/include", "-o", exe, src, f"-L{i}/lib", "-lmpi", f"-Wl,-rpath,{i}/lib"]
        else:
            cmd = [os.path.join(c, PREFIX[a], "bin", "mpicc"), "-O2", "-o", exe, src]
    if os.access(exe, os.X_OK) and os.path.getmtime(exe) >= os.path.getmtime(src):
        return exe
    os.makedirs(os.path.dirname(exe), exist_ok=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    return exe if p.returncode == 0 else (None, _why(p.stdout, p.stderr, p.returncode))


def ncpu():
    """The cores this process may run on (what nproc, and so run_anchor.sh, counts)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def oversubscribed(n):
    return n > ncpu()


def launch_cmd(a, exe, n, args, tcp=False):
    """(env, argv) running program exe (built with anchor a's MPI, or oneCCL's
    for the ccl anchors) on n ranks under a's launcher, with the transport
    settings run_anchor.sh uses for a (its README)."""
    c = cache()
    m, i = os.path.join(c, PREFIX["mpich"]), os.path.join(c, PREFIX["impi"])
    env, args = {}, [str(x) for x in args]
    if a == "ompi":
        btl = "self,tcp" if tcp else "self,sm"
        cmd = [os.path.join(c, PREFIX["ompi"], "bin", "mpirun"), "--allow-run-as-root", "--oversubscribe",
               "-np", str(n), "--mca", "pml", "ob1", "--mca", "btl", btl, exe, *args]
    elif a == "mpich":
        if tcp:
            env.update(MPIR_CVAR_NOLOCAL="1", UCX_TLS="tcp")
        if oversubscribed(n):
            env.update(MPIR_CVAR_CH4_PROGRESS_THROTTLE="1", MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT="64")
        cmd = [os.path.join(m, "bin", "mpiexec"), "-launcher", "fork", "-n", str(n), exe, *args]
    elif a == "impi":
        env["I_MPI_ROOT"] = i
        if tcp:
            env.update(I_MPI_FABRICS="ofi", FI_PROVIDER="tcp", I_MPI_COLL_INTRANODE="pt2pt",
                       I_MPI_OFI_LIBRARY=os.path.join(m, "lib", "mpich", "libfabric.so.1"))
        else:
            env["I_MPI_FABRICS"] = "shm"
        cmd = [os.path.join(i, "bin", "mpiexec"), "-n", str(n), exe, *args]
    else:  # ccl, ccl-mpi, ccl-impi: run_anchor.sh's oneCCL settings
        env.update(CCL_WORKER_OFFLOAD="0", CCL_WORKER_WAIT="1", CCL_LOG_LEVEL="error")
        if a == "ccl":
            env.update(CCL_ATL_TRANSPORT="ofi", CCL_OFI_LIBRARY_PATH=os.path.join(m, "lib", "mpich", "libfabric.so.1"))
            env.update(CCL_ATL_SHM="0", FI_PROVIDER="tcp") if tcp else env.update(CCL_ATL_SHM="1")
            cmd = [os.path.join(m, "bin", "mpiexec"), "-launcher", "fork", "-n", str(n), exe, *args]
        elif a == "ccl-mpi":
            env.update(CCL_ATL_TRANSPORT="mpi", CCL_MPI_LIBRARY_PATH=os.path.join(m, "lib", "libmpi.so.12"))
            if tcp:
                env.update(MPIR_CVAR_NOLOCAL="1", UCX_TLS="tcp")
            cmd = [os.path.join(m, "bin", "mpiexec"), "-launcher", "fork", "-n", str(n), exe, *args]
        else:
            env.update(CCL_ATL_TRANSPORT="mpi", CCL_MPI_LIBRARY_PATH=os.path.join(i, "lib", "libmpi.so.12"),
                       I_MPI_ROOT=i)
            if tcp:
                env.update(I_MPI_FABRICS="ofi", FI_PROVIDER="tcp", I_MPI_COLL_INTRANODE="pt2pt",
                           I_MPI_OFI_LIBRARY=os.path.join(m, "lib", "mpich", "libfabric.so.1"))
            else:
                env["I_MPI_FABRICS"] = "shm"
            cmd = [os.path.join(i, "bin", "mpiexec"), "-n", str(n), exe, *args]
        if oversubscribed(n):
            env.update(CCL_YIELD="sched_yield", MPIR_CVAR_CH4_PROGRESS_THROTTLE="1",
                       MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT="64")
    return env, cmd


def sendrecv_cmd(a, exe, n, lo, hi, tcp):
    """(env, argv) running mpi_sendrecv (ccl_sendrecv for the ccl anchors)
    under anchor a's launcher and transport settings."""
    return launch_cmd(a, exe, n, ["sendrecv", lo, hi], tcp)


def measure_cmd(impl, coll, n, lo, hi, anchors_dir, p2p):
    """(env, argv) of one anchor measurement, or raises RuntimeError."""
    a, tcp = split_impl(impl)
    if coll == "send_recv":
        if a not in p2p:
            raise RuntimeError(f"{a}: no send_recv program")
        env, cmd = sendrecv_cmd(a, p2p[a], n, lo, hi, tcp)
        env["ANCHOR_CACHE"] = cache()
        return env, ["timeout", str(RUN_TIMEOUT), *cmd]
    return ({"ANCHOR_CACHE": cache(), "ANCHOR_TIMEOUT": str(RUN_TIMEOUT)},
            [script(anchors_dir), a, coll, str(n), str(lo), str(hi), *(["tcp"] if tcp else [])])


def applies(impl, coll, n, status, p2p, force_oversub):
    """None if impl (an anchor implementation) runs coll at n ranks, else why not."""
    a, _ = split_impl(impl)
    if status.get(a, "not prepared") is not None:
        return "not installed"
    if coll == "send_recv" and a not in p2p:
        return "no send/recv program for it" if a not in P2P else "send_recv build failed"
    if coll not in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv"):
        return f"no {coll}"
    if oversubscribed(n) and a in BUSY_POLL and not force_oversub:
        return (f"{n} ranks on {ncpu()} cores: it busy-polls and collapses to scheduler "
                "time slices (BENCH_OVERSUB=1 runs it anyway, marked OVERSUBSCRIBED)")
    return None


def collapsing(impl, n):
    """Whether impl's runs at n ranks stay out of the best-anchor choice: the
    script marks them OVERSUBSCRIBED and the anchor busy-polls."""
    s = split_impl(impl)
    return bool(s) and oversubscribed(n) and s[0] in BUSY_POLL


def best(get, anchors, n, coll, size, tcp):
    """(busbw, impl) of the best (highest busbw) anchor at a point, collapsing
    runs left out; (None, None) if none was measured there."""
    top = (None, None)
    for a in anchors:
        impl = a + "-tcp" if tcp else a
        if collapsing(impl, n):
            continue
        bw = get(impl, n, coll, size)
        if bw is not None and (top[0] is None or bw > top[0]):
            top = (bw, impl)
    return top
