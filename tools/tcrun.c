/* tcrun.c -- launch N local ranks of any program, like `torchrun --no-python`
 * or mpirun, without Python.
 *
 * usage: tcrun -n N [--tag-output] [--grace SECONDS] [--timeout SECONDS]
 *              [--port PORT] [--bind-to auto|core|none]
 *              [--nnodes N --node-rank K --master-addr ADDR --port P
 *               [--join-timeout SECONDS]] [--] program [args...]
 *
 * tcrun hosts a TCPStore server itself (on 127.0.0.1, port PORT or a free
 * one), then starts N copies of `program` (searched in PATH), each with the
 * environment torchrun gives its workers:
 *
 *   RANK=r WORLD_SIZE=N LOCAL_RANK=r LOCAL_WORLD_SIZE=N GROUP_RANK=0
 *   GROUP_WORLD_SIZE=1 ROLE_RANK=r ROLE_WORLD_SIZE=N ROLE_NAME=default
 *   MASTER_ADDR=127.0.0.1 MASTER_PORT=<store port>
 *   TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=0
 *   TORCHELASTIC_MAX_RESTARTS=0 TORCHELASTIC_RUN_ID=tcrun-<pid>
 *   OMP_NUM_THREADS=1 (only when N > 1 and it is not already set)
 *
 * TORCHELASTIC_USE_AGENT_STORE=True tells every rank (ours and torch's) that
 * the store at MASTER_ADDR:MASTER_PORT is hosted by the launcher, so every
 * rank connects to it as a client -- exactly the path taken under torchrun.
 *
 * Several nodes (--nnodes N > 1, one tcrun per host, like torchrun's static
 * rendezvous): node 0's tcrun hosts the store on --master-addr:--port (an
 * address of node 0's host; it binds that address only), every tcrun
 * (node 0's too) connects to it as a client and publishes its node's rank
 * count, waits up to --join-timeout (default 300 s) for all N nodes, and
 * then starts its ranks with
 *
 *   RANK = (ranks of nodes 0..K-1) + local rank  WORLD_SIZE = all ranks
 *   LOCAL_RANK, LOCAL_WORLD_SIZE = this node's   GROUP_RANK=K GROUP_WORLD_SIZE=N
 *   MASTER_ADDR=ADDR MASTER_PORT=P  TORCHELASTIC_RUN_ID = node 0's run id
 *
 * so with the same -n everywhere RANK = K * n + local rank, as torchrun;
 * -n may also differ between nodes (the ranks are numbered node by node).
 * Each tcrun supervises only its own ranks (a failed rank stops its node's
 * ranks; those of other nodes see the dead peer through the library and
 * fail by themselves); when its ranks have ended every node marks itself
 * done in the store, and node 0 keeps the store up until all nodes are done
 * (at most --join-timeout more), so no rank loses the store while it still
 * finalizes.
 *
 * Each rank runs in its own process group, so signals reach its children
 * too; when tcrun stops the job, processes a rank left behind in its group
 * are SIGKILLed with the ranks at the end of the grace period (tcrun is a
 * child subreaper, so it sees them exit). Rank 0 inherits tcrun's stdin; the other ranks read /dev/null.
 * With --tag-output every line a rank writes to stdout/stderr is copied to
 * tcrun's stdout/stderr prefixed with "[r]: "; whole lines only, so lines
 * of different ranks never mix (a line longer than 64 KiB is broken).
 *
 * When a rank exits non-zero or dies by a signal, tcrun reports it, sends
 * SIGTERM to the other ranks, SIGKILL after --grace seconds (default 3),
 * and exits with that rank's exit code (128+S for signal S). SIGINT,
 * SIGTERM and SIGHUP received by tcrun are forwarded to every rank (tcrun
 * then exits 128+S); --timeout stops all ranks the same way and exits 124.
 * Exit status 127/126: the program cannot be found/executed; 2: bad usage.
 *
 * --bind-to auto (the default) pins rank r to core r % C of tcrun's own
 * CPU affinity mask (C cores) when N >= 2: with N <= C each rank owns a
 * core, as mpirun binds, so the scheduler never moves it onto its peer's
 * core and under a foreign CPU load each rank keeps its own core's share;
 * with more ranks than cores they are dealt round-robin, which keeps the
 * scheduler from stacking three ranks of a 4-rank job on one core (the
 * slow launches of an unbound oversubscribed job; docs/benchmarks.md,
 * "Runs 31 and 32"). One rank: not bound.
 *
 * When the job ends, tcrun removes the shared-memory segments of ranks that
 * died before unlinking them (src/transport/shm_sweep.c).
 *
 * Waiting never spins: one poll() over a self-pipe fed by the signal
 * handlers (SIGCHLD included) and the output pipes, with a timeout only
 * when a deadline is pending.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "private_api.h" /* tc__log, tc__now, tc__settings_print, tc__shm_sweep */

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

#define TCRUN_MAX_RANKS 4096
#define TCRUN_MAX_NODES 4096
#define TCRUN_JOIN_TIMEOUT 300.0 /* default --join-timeout, seconds */
#define TCRUN_MAX_LINE (64 * 1024)
#define TCRUN_BIND_HOST "127.0.0.1"

/* --bind-to: auto binds rank r to core r % C of the C cores tcrun may run
 * on when there are 2 ranks or more (Open MPI's mpirun binds to cores by
 * default for 2 ranks, and so keeps a spinning rank off its peer's core;
 * round-robin beyond C ranks); core binds always, one rank too; none
 * never. */
enum { TCRUN_BIND_AUTO, TCRUN_BIND_CORE, TCRUN_BIND_NONE };

extern char **environ;

/* One output pipe of a rank (only with --tag-output). */
typedef struct {
  int fd;      /* read end; -1 once closed */
  int dest;    /* 1 (stdout) or 2 (stderr) */
  char *buf;   /* bytes read but not yet written (no complete line) */
  size_t len, cap;
} tcrun_stream_t;

/* One rank's process. */
typedef struct {
  pid_t pid;   /* 0 until forked */
  int live;    /* forked and not yet reaped */
  char **env;  /* its environment, built before fork */
  int cpu;     /* the core it is bound to (--bind-to), or -1 */
  tcrun_stream_t out, err;
} tcrun_rank_t;

/* Command line options. */
typedef struct {
  int nranks;
  int tag_output;
  double grace;   /* seconds between SIGTERM and SIGKILL */
  double timeout; /* seconds; 0 = none */
  int port;
  int bind;       /* TCRUN_BIND_* (--bind-to) */
  int nnodes;     /* --nnodes (1: this host only) */
  int node_rank;  /* --node-rank, -1 if not given */
  const char *master_addr; /* --master-addr, NULL if not given */
  double join_timeout; /* --join-timeout: seconds to wait for every node */
  char **argv;    /* program and its arguments, NULL-terminated */
} tcrun_opts_t;

/* Whole-run state. */
typedef struct {
  tcrun_opts_t o;
  tcrun_rank_t *ranks;
  int nlive;         /* forked ranks not yet reaped */
  int stopping;      /* ranks were told to stop (failure, timeout, signal) */
  int killed;        /* SIGKILL already sent */
  int exit_code;     /* tcrun's exit status */
  double kill_at;    /* when to SIGKILL the remaining ranks (if stopping) */
  int dest_broken[3];/* our stdout/stderr failed (EPIPE...): drop output */
  int first_private_fd; /* fds >= this were opened by tcrun (-1: unknown) */
  int fd_limit;      /* fallback bound for marking fds close-on-exec */
  int devnull;       /* /dev/null, stdin of ranks > 0 */
  sigset_t handled;  /* the signals tcrun catches */
  sigset_t orig_mask;
  int rank0;         /* global rank of this node's local rank 0 */
  int world;         /* WORLD_SIZE: ranks of every node */
  char run_id[64];   /* TORCHELASTIC_RUN_ID (node 0's on every node) */
} tcrun_t;

static int tcrun_sigpipe[2] = {-1, -1};
static const int tcrun_caught[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};

/* Writes all of buf to fd, retrying on EINTR and short writes. Returns 0,
 * or -1 on an error (errno set). */
static int tcrun_write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Prints "tcrun: <message>\n" to stderr with a single write. */
__attribute__((format(printf, 1, 2))) static void tcrun_msg(const char *fmt,
                                                             ...) {
  char line[1024];
  int k = snprintf(line, sizeof line, "tcrun: ");
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + k, sizeof line - (size_t)k - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)k + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof line - 2) len = sizeof line - 2;
  line[len++] = '\n';
  (void)tcrun_write_all(2, line, len);
}

/* The usage text, to stdout (--help) or stderr (bad arguments). */
static void tcrun_usage(FILE *f) {
  fputs(
      "usage: tcrun -n N [--tag-output] [--grace SECONDS] [--timeout SECONDS]\n"
      "             [--port PORT] [--bind-to auto|core|none]\n"
      "             [--nnodes N --node-rank K --master-addr ADDR --port PORT\n"
      "              [--join-timeout SECONDS]] [--] program [args...]\n"
      "\n"
      "Starts N ranks of program on this host with torchrun's environment\n"
      "(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK,\n"
      "MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True, ...) and\n"
      "a TCPStore server hosted by tcrun at MASTER_ADDR:MASTER_PORT.\n"
      "\n"
      "Several hosts: run one tcrun per host with the same --nnodes,\n"
      "--master-addr and --port and its own --node-rank. Node 0's tcrun hosts\n"
      "the store on ADDR:PORT (ADDR must be an address of node 0's host); the\n"
      "others connect to it. RANK = ranks of the nodes before + LOCAL_RANK\n"
      "(K * N when every node has N ranks; -n may differ between nodes),\n"
      "WORLD_SIZE = all ranks, GROUP_RANK = K, GROUP_WORLD_SIZE = --nnodes.\n"
      "\n"
      "options:\n"
      "  -n, --nproc-per-node N  number of ranks on this host (1.." "4096)\n"
      "  --tag-output            prefix each output line with \"[RANK]: \"\n"
      "  --grace SECONDS         after a failure, time between SIGTERM and\n"
      "                          SIGKILL for the other ranks (default 3)\n"
      "  --timeout SECONDS       stop all ranks and exit 124 after this long\n"
      "                          (default 0: no limit)\n"
      "  --port PORT             the store's port (default 0: a free port;\n"
      "                          required with --nnodes > 1)\n"
      "  --nnodes N              number of hosts (nodes) of the job (default 1)\n"
      "  --node-rank K           this host's node rank, 0..N-1 (default 0;\n"
      "                          required with --nnodes > 1)\n"
      "  --master-addr ADDR      node 0's address: where node 0 hosts the store\n"
      "                          and every rank finds it (default 127.0.0.1;\n"
      "                          required with --nnodes > 1)\n"
      "  --join-timeout SECONDS  how long to wait for every node to join, and\n"
      "                          node 0 for every node to finish (default 300)\n"
      "  --bind-to WHAT          auto (default): with N >= 2, bind rank r to\n"
      "                          core r % C of the C cores tcrun may run on\n"
      "                          (like mpirun up to C ranks; round-robin\n"
      "                          beyond); core: always, one rank too; none:\n"
      "                          never\n"
      "  -h, --help              print this help and exit\n"
      "  --help-env              print every TORCHCOMMS_* setting and exit\n"
      "\n"
      "exit status: 0 if every rank exits 0; else the first failing rank's\n"
      "exit code (128+S if killed by signal S); 124 on --timeout; 127/126 if\n"
      "program cannot be found/run; 128+S if tcrun gets signal S; 2: usage;\n"
      "1: tcrun itself failed (store, joining the other nodes).\n",
      f);
}

/* Reports a usage error and exits 2. */
__attribute__((format(printf, 1, 2), noreturn)) static void
tcrun_bad_usage(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("tcrun: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputs("\n", stderr);
  va_end(ap);
  tcrun_usage(stderr);
  exit(2);
}

/* Parses a whole decimal integer in [lo, hi] for option `opt`, or exits 2. */
static int tcrun_parse_int(const char *opt, const char *s, long lo, long hi) {
  char *end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (!*s || *end || errno || v < lo || v > hi)
    tcrun_bad_usage("bad value for %s: '%s' (expected an integer from %ld "
                    "to %ld)", opt, s, lo, hi);
  return (int)v;
}

/* Parses a finite number of seconds >= 0 for option `opt`, or exits 2. */
static double tcrun_parse_seconds(const char *opt, const char *s) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (!*s || *end || errno || !isfinite(v) || v < 0 || v > 1e9)
    tcrun_bad_usage("bad value for %s: '%s' (expected seconds >= 0)", opt, s);
  return v;
}

/* If argv[*i] is option `name` ("--name V" or "--name=V"), returns its
 * value (advancing *i past it); NULL if it is another option. A missing
 * value exits 2. */
static const char *tcrun_optval(int argc, char **argv, int *i,
                                const char *name) {
  const char *a = argv[*i];
  size_t n = strlen(name);
  if (strncmp(a, name, n) != 0) return NULL;
  if (a[n] == '=') return a + n + 1;
  if (a[n] != '\0') return NULL;
  if (*i + 1 >= argc) tcrun_bad_usage("option '%s' needs a value", name);
  return argv[++*i];
}

/* Parses the command line into *o; --help prints usage and exits 0, any
 * error prints usage and exits 2. */
static void tcrun_parse_args(int argc, char **argv, tcrun_opts_t *o) {
  *o = (tcrun_opts_t){.nranks = 0, .grace = 3.0, .timeout = 0, .port = 0,
                      .nnodes = 1, .node_rank = -1,
                      .join_timeout = TCRUN_JOIN_TIMEOUT};
  int port_given = 0;
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i], *v;
    if (!strcmp(a, "--")) {
      i++;
      break;
    }
    if (a[0] != '-' || a[1] == '\0') break; /* the program */
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      tcrun_usage(stdout);
      exit(0);
    } else if (!strcmp(a, "--help-env")) {
      tc__settings_print(stdout);
      exit(0);
    } else if (!strcmp(a, "--tag-output")) {
      o->tag_output = 1;
    } else if ((v = tcrun_optval(argc, argv, &i, "-n")) ||
               (v = tcrun_optval(argc, argv, &i, "-np")) ||
               (v = tcrun_optval(argc, argv, &i, "--nproc-per-node")) ||
               (v = tcrun_optval(argc, argv, &i, "--nproc_per_node"))) {
      o->nranks = tcrun_parse_int("-n", v, 1, TCRUN_MAX_RANKS);
    } else if (!strncmp(a, "-n", 2) && a[2] >= '0' && a[2] <= '9') {
      o->nranks = tcrun_parse_int("-n", a + 2, 1, TCRUN_MAX_RANKS); /* -n4 */
    } else if ((v = tcrun_optval(argc, argv, &i, "--grace"))) {
      o->grace = tcrun_parse_seconds("--grace", v);
    } else if ((v = tcrun_optval(argc, argv, &i, "--timeout"))) {
      o->timeout = tcrun_parse_seconds("--timeout", v);
    } else if ((v = tcrun_optval(argc, argv, &i, "--port"))) {
      o->port = tcrun_parse_int("--port", v, 0, 65535);
      port_given = 1;
    } else if ((v = tcrun_optval(argc, argv, &i, "--nnodes"))) {
      o->nnodes = tcrun_parse_int("--nnodes", v, 1, TCRUN_MAX_NODES);
    } else if ((v = tcrun_optval(argc, argv, &i, "--node-rank")) ||
               (v = tcrun_optval(argc, argv, &i, "--node_rank"))) {
      o->node_rank = tcrun_parse_int("--node-rank", v, 0, TCRUN_MAX_NODES - 1);
    } else if ((v = tcrun_optval(argc, argv, &i, "--master-addr")) ||
               (v = tcrun_optval(argc, argv, &i, "--master_addr"))) {
      if (!*v || strlen(v) > 255)
        tcrun_bad_usage("bad value for --master-addr: '%s' (expected a host "
                        "name or address)", v);
      o->master_addr = v;
    } else if ((v = tcrun_optval(argc, argv, &i, "--join-timeout"))) {
      o->join_timeout = tcrun_parse_seconds("--join-timeout", v);
    } else if ((v = tcrun_optval(argc, argv, &i, "--bind-to"))) {
      if (!strcmp(v, "auto")) o->bind = TCRUN_BIND_AUTO;
      else if (!strcmp(v, "core")) o->bind = TCRUN_BIND_CORE;
      else if (!strcmp(v, "none")) o->bind = TCRUN_BIND_NONE;
      else tcrun_bad_usage("bad value for --bind-to: '%s' (expected auto, core or none)", v);
    } else {
      tcrun_bad_usage("unknown option '%s'", a);
    }
  }
  if (o->nranks == 0) tcrun_bad_usage("-n N (the number of ranks) is required");
  if (o->node_rank >= o->nnodes)
    tcrun_bad_usage("bad value for --node-rank: '%d' (expected 0 to %d: "
                    "--nnodes is %d)", o->node_rank, o->nnodes - 1, o->nnodes);
  if (o->nnodes > 1) {
    if (o->node_rank < 0)
      tcrun_bad_usage("--nnodes %d needs --node-rank K (this host's node, 0 to "
                      "%d)", o->nnodes, o->nnodes - 1);
    if (!o->master_addr)
      tcrun_bad_usage("--nnodes %d needs --master-addr ADDR (node 0's address, "
                      "where it hosts the store)", o->nnodes);
    if (!port_given || o->port == 0)
      tcrun_bad_usage("--nnodes %d needs --port PORT (a fixed port: the other "
                      "nodes must know it)", o->nnodes);
  }
  if (o->node_rank < 0) o->node_rank = 0;
  if (i >= argc) tcrun_bad_usage("no program given");
  o->argv = argv + i;
}

/* Short name of a signal ("SIGKILL"), or "unknown signal". */
static const char *tcrun_signame(int sig) {
  static const struct {
    int sig;
    const char *name;
  } names[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"},
      {SIGILL, "SIGILL"},   {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},
      {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"},
      {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
      {SIGCHLD, "SIGCHLD"}, {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"},
      {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"}, {SIGTTOU, "SIGTTOU"},
      {SIGURG, "SIGURG"},   {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
      {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGSYS, "SIGSYS"},
  };
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
    if (names[k].sig == sig) return names[k].name;
  return "unknown signal";
}

/* Signal handler: records the signal number in the self-pipe, which the
 * main loop polls. Async-signal-safe; preserves errno. */
static void tcrun_on_signal(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  if (write(tcrun_sigpipe[1], &b, 1) < 0) { /* full pipe: already awake */
  }
  errno = saved;
}

/* Makes sure fds 0, 1 and 2 are open (on /dev/null if not), so that pipes
 * created later never take those numbers. */
static void tcrun_ensure_std_fds(void) {
  for (int fd = 0; fd < 3; fd++)
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      int d = open("/dev/null", O_RDWR);
      if (d >= 0 && d != fd) close(d); /* cannot happen: lowest fd is fd */
    }
}

/* 1 + the highest fd open now (inherited from our parent), or -1 if
 * /proc/self/fd cannot be read. Fds from there on are tcrun's own. */
static int tcrun_first_private_fd(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int self = dirfd(d), hi = 2;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    int fd = atoi(e->d_name);
    if (fd != self && fd > hi) hi = fd;
  }
  closedir(d);
  return hi + 1;
}

/* Installs the signal handlers and creates the self-pipe. Returns 0/-1. */
static int tcrun_setup_signals(tcrun_t *t) {
  if (pipe2(tcrun_sigpipe, O_CLOEXEC | O_NONBLOCK) < 0) return -1;
  sigemptyset(&t->handled);
  for (size_t k = 0; k < sizeof tcrun_caught / sizeof tcrun_caught[0]; k++) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = tcrun_on_signal;
    sa.sa_flags = SA_RESTART | (tcrun_caught[k] == SIGCHLD ? SA_NOCLDSTOP : 0);
    sigemptyset(&sa.sa_mask);
    if (sigaction(tcrun_caught[k], &sa, NULL) < 0) return -1;
    sigaddset(&t->handled, tcrun_caught[k]);
  }
  signal(SIGPIPE, SIG_IGN); /* a closed stdout must not kill the launcher */
  return 0;
}

/* MASTER_ADDR: --master-addr, else the loopback address tcrun binds. */
static const char *tcrun_master(const tcrun_t *t) {
  return t->o.master_addr ? t->o.master_addr : TCRUN_BIND_HOST;
}

/* Builds rank r's environment: ours minus the variables set here, plus
 * torchrun's worker variables. Returns a malloc()ed NULL-terminated array
 * of malloc()ed strings, or NULL when out of memory. */
static char **tcrun_build_env(const tcrun_t *t, int r, int port) {
  int n = t->o.nranks, m = 0;
  char mine[16][320];
#define TCRUN_VAR(...) snprintf(mine[m++], sizeof mine[0], __VA_ARGS__)
  TCRUN_VAR("RANK=%d", t->rank0 + r);
  TCRUN_VAR("WORLD_SIZE=%d", t->world);
  TCRUN_VAR("LOCAL_RANK=%d", r);
  TCRUN_VAR("LOCAL_WORLD_SIZE=%d", n);
  TCRUN_VAR("GROUP_RANK=%d", t->o.node_rank);
  TCRUN_VAR("GROUP_WORLD_SIZE=%d", t->o.nnodes);
  TCRUN_VAR("ROLE_RANK=%d", t->rank0 + r);
  TCRUN_VAR("ROLE_WORLD_SIZE=%d", t->world);
  TCRUN_VAR("ROLE_NAME=default");
  TCRUN_VAR("MASTER_ADDR=%s", tcrun_master(t));
  TCRUN_VAR("MASTER_PORT=%d", port);
  TCRUN_VAR("TORCHELASTIC_USE_AGENT_STORE=True");
  TCRUN_VAR("TORCHELASTIC_RESTART_COUNT=0");
  TCRUN_VAR("TORCHELASTIC_MAX_RESTARTS=0");
  TCRUN_VAR("TORCHELASTIC_RUN_ID=%s", t->run_id);
  /* like torchrun: one OpenMP thread per rank when ranks share the host */
  if (n > 1 && !getenv("OMP_NUM_THREADS")) TCRUN_VAR("OMP_NUM_THREADS=1");
#undef TCRUN_VAR
  size_t count = 0, k = 0;
  while (environ[count]) count++;
  char **env = calloc(count + (size_t)m + 1, sizeof *env);
  if (!env) return NULL;
  for (size_t e = 0; e < count; e++) {
    int ours = 0;
    for (int j = 0; j < m && !ours; j++) /* compare "NAME=" */
      ours = !strncmp(environ[e], mine[j], (size_t)(strchr(mine[j], '=') - mine[j]) + 1);
    if (!ours && !(env[k++] = strdup(environ[e]))) goto oom;
  }
  for (int j = 0; j < m; j++)
    if (!(env[k++] = strdup(mine[j]))) goto oom;
  return env;
oom:
  for (size_t j = 0; env[j]; j++) free(env[j]);
  free(env);
  return NULL;
}

/* Frees an environment from tcrun_build_env (NULL is fine). */
static void tcrun_free_env(char **env) {
  if (!env) return;
  for (size_t j = 0; env[j]; j++) free(env[j]);
  free(env);
}

/* Makes d a copy of fd (clearing close-on-exec), in the child. */
static void tcrun_child_dup(int fd, int d) {
  if (fd == d) fcntl(fd, F_SETFD, 0);
  else dup2(fd, d);
}

/* In the forked child: sets up process group, signals, stdio and fds, then
 * execs the program with env. On failure writes errno to exec_w and exits
 * 127 (not found) or 126. Only async-signal-safe calls (the parent may have
 * threads). */
static void tcrun_child(const tcrun_t *t, int r, char **env, int out_w,
                        int err_w, int exec_w) {
  setpgid(0, 0);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  for (size_t k = 0; k < sizeof tcrun_caught / sizeof tcrun_caught[0]; k++)
    sigaction(tcrun_caught[k], &sa, NULL);
  sigaction(SIGPIPE, &sa, NULL);
  sigprocmask(SIG_SETMASK, &t->orig_mask, NULL);
  if (t->ranks[r].cpu >= 0) { /* best effort: a core taken away meanwhile is no error */
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(t->ranks[r].cpu, &one);
    (void)sched_setaffinity(0, sizeof one, &one);
  }
  if (r > 0 && t->devnull >= 0) tcrun_child_dup(t->devnull, 0);
  if (out_w >= 0) tcrun_child_dup(out_w, 1);
  if (err_w >= 0) tcrun_child_dup(err_w, 2);
  /* fds tcrun opened (store sockets, other ranks' pipes) must not leak */
  if (t->first_private_fd > 2) {
    long rc = -1;
#ifdef SYS_close_range
    rc = syscall(SYS_close_range, (unsigned)t->first_private_fd, ~0U,
                 CLOSE_RANGE_CLOEXEC);
#endif
    for (int fd = t->first_private_fd; rc != 0 && fd < t->fd_limit; fd++)
      fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  execvpe(t->o.argv[0], t->o.argv, env);
  int e = errno;
  if (write(exec_w, &e, sizeof e) < 0) {
  }
  _exit(e == ENOENT ? 127 : 126);
}

/* Sends sig to the process group of every live rank, and with `all` also
 * to the groups of reaped ranks (what they left behind). */
static void tcrun_signal_groups(tcrun_t *t, int sig, int all) {
  for (int r = 0; r < t->o.nranks; r++) {
    tcrun_rank_t *rk = &t->ranks[r];
    if (rk->pid <= 0 || (!rk->live && !all)) continue;
    if (kill(-rk->pid, sig) < 0 && rk->live)
      kill(rk->pid, sig); /* setpgid lost a race */
  }
}

/* Sends sig to the process group of every live rank. */
static void tcrun_signal_all(tcrun_t *t, int sig) { tcrun_signal_groups(t, sig, 0); }

/* 1 if a reaped rank's process group still has members (its leftovers; a
 * group id is not reused as a pid while the group exists). */
static int tcrun_leftovers(const tcrun_t *t) {
  for (int r = 0; r < t->o.nranks; r++)
    if (t->ranks[r].pid > 0 && !t->ranks[r].live && kill(-t->ranks[r].pid, 0) == 0)
      return 1;
  return 0;
}

/* Starts stopping all ranks: sends sig to them and arms the SIGKILL
 * deadline. exit_code becomes tcrun's status unless one is already set. */
static void tcrun_stop(tcrun_t *t, int sig, int exit_code) {
  if (!t->stopping) {
    t->stopping = 1;
    t->exit_code = exit_code;
    t->kill_at = tc__now() + t->o.grace;
  }
  tcrun_signal_all(t, sig);
}

/* Chooses each rank's core (--bind-to) among the cores tcrun may run on. */
static void tcrun_plan_binding(tcrun_t *t) {
  cpu_set_t set;
  int cpus[CPU_SETSIZE], ncpu = 0;
  for (int r = 0; r < t->o.nranks; r++) t->ranks[r].cpu = -1;
  if (t->o.bind == TCRUN_BIND_NONE || sched_getaffinity(0, sizeof set, &set) != 0) return;
  for (int k = 0; k < CPU_SETSIZE; k++)
    if (CPU_ISSET(k, &set)) cpus[ncpu++] = k;
  if (ncpu == 0) return;
  if (t->o.bind == TCRUN_BIND_AUTO && t->o.nranks < 2) return;
  for (int r = 0; r < t->o.nranks; r++) t->ranks[r].cpu = cpus[r % ncpu];
}

/* Forks rank r with its pipes; returns 0, or -1 after reporting why the
 * rank could not be started (and setting t->exit_code). */
static int tcrun_spawn(tcrun_t *t, int r) {
  tcrun_rank_t *rk = &t->ranks[r];
  int outp[2] = {-1, -1}, errp[2] = {-1, -1}, execp[2] = {-1, -1};
  int rc = -1;
  if ((t->o.tag_output && (pipe2(outp, O_CLOEXEC) < 0 ||
                           pipe2(errp, O_CLOEXEC) < 0)) ||
      pipe2(execp, O_CLOEXEC) < 0) {
    tcrun_msg("cannot create a pipe for rank %d: %s", t->rank0 + r, strerror(errno));
    t->exit_code = 1;
    goto out;
  }
  /* Signals stay blocked between fork and the child's handler reset, so
   * the child never runs tcrun's handler (which writes to our self-pipe). */
  sigset_t old;
  pthread_sigmask(SIG_BLOCK, &t->handled, &old);
  pid_t pid = fork();
  if (pid == 0) tcrun_child(t, r, rk->env, outp[1], errp[1], execp[1]);
  int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (pid < 0) {
    tcrun_msg("cannot start rank %d: fork: %s", t->rank0 + r, strerror(fork_errno));
    t->exit_code = 1;
    goto out;
  }
  setpgid(pid, pid); /* also in the parent: no window without a group */
  rk->pid = pid;
  rk->live = 1;
  t->nlive++;
  close(execp[1]);
  execp[1] = -1;
  int e = 0;
  ssize_t n;
  do n = read(execp[0], &e, sizeof e);
  while (n < 0 && errno == EINTR);
  if (n == (ssize_t)sizeof e) { /* exec failed; the child exits */
    tcrun_msg("cannot run '%s': %s", t->o.argv[0], strerror(e));
    t->exit_code = e == ENOENT ? 127 : 126;
    goto out;
  }
  if (t->o.tag_output) {
    rk->out = (tcrun_stream_t){.fd = outp[0], .dest = 1};
    rk->err = (tcrun_stream_t){.fd = errp[0], .dest = 2};
    outp[0] = errp[0] = -1;
    fcntl(rk->out.fd, F_SETFL, O_NONBLOCK);
    fcntl(rk->err.fd, F_SETFL, O_NONBLOCK);
  }
  rc = 0;
out:
  for (int k = 0; k < 2; k++) {
    if (outp[k] >= 0) close(outp[k]);
    if (errp[k] >= 0) close(errp[k]);
    if (execp[k] >= 0) close(execp[k]);
  }
  return rc;
}

/* Writes len bytes of a rank's output as prefixed lines to s->dest; when
 * `partial`, the data has no final newline and one is added. */
static void tcrun_emit(tcrun_t *t, tcrun_stream_t *s, int r, const char *data,
                       size_t len) {
  if (t->dest_broken[s->dest]) return;
  char prefix[32];
  int plen = snprintf(prefix, sizeof prefix, "[%d]: ", t->rank0 + r);
  size_t lines = 0;
  for (size_t k = 0; k < len; k++) lines += data[k] == '\n';
  if (len > 0 && data[len - 1] != '\n') lines++;
  char *out = malloc(len + lines * ((size_t)plen + 1));
  if (!out) { /* no memory for the copy: drop this destination's output */
    t->dest_broken[s->dest] = 1;
    tcrun_msg("out of memory; dropping the output of the ranks");
    return;
  }
  size_t o = 0, start = 0;
  while (start < len) {
    const char *nl = memchr(data + start, '\n', len - start);
    size_t end = nl ? (size_t)(nl - data) : len; /* exclusive of '\n' */
    memcpy(out + o, prefix, (size_t)plen);
    o += (size_t)plen;
    memcpy(out + o, data + start, end - start);
    o += end - start;
    out[o++] = '\n';
    start = end + 1;
  }
  if (tcrun_write_all(s->dest, out, o) < 0) t->dest_broken[s->dest] = 1;
  free(out);
}

/* Closes a stream, writing out a last line that had no newline. */
static void tcrun_stream_close(tcrun_t *t, tcrun_stream_t *s, int r) {
  if (s->len) tcrun_emit(t, s, r, s->buf, s->len);
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
  free(s->buf);
  s->buf = NULL;
  s->len = s->cap = 0;
}

/* Reads what is available on a rank's pipe and writes out every complete
 * line; closes the stream at EOF. */
static void tcrun_stream_read(tcrun_t *t, tcrun_stream_t *s, int r) {
  if (s->cap - s->len < 4096) {
    size_t cap = s->cap ? s->cap * 2 : 8192;
    char *b = realloc(s->buf, cap);
    if (!b) {
      tcrun_stream_close(t, s, r);
      return;
    }
    s->buf = b;
    s->cap = cap;
  }
  ssize_t n = read(s->fd, s->buf + s->len, s->cap - s->len);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    tcrun_stream_close(t, s, r);
    return;
  }
  s->len += (size_t)n;
  size_t done = 0;
  for (size_t k = s->len; k > 0; k--)
    if (s->buf[k - 1] == '\n') {
      done = k;
      break;
    }
  if (done == 0 && s->len >= TCRUN_MAX_LINE) done = s->len; /* break it */
  if (done == 0) return;
  tcrun_emit(t, s, r, s->buf, done);
  memmove(s->buf, s->buf + done, s->len - done);
  s->len -= done;
}

/* Reports a rank's abnormal end (first failure only) and stops the others. */
static void tcrun_rank_ended(tcrun_t *t, int r, int status) {
  tcrun_rank_t *rk = &t->ranks[r];
  rk->live = 0;
  t->nlive--;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (t->stopping) { /* expected: we are stopping it */
    tc__log(2, "tcrun: rank %d (pid %d) ended with status %d while stopping",
            t->rank0 + r, (int)rk->pid, code);
    return;
  }
  if (WIFEXITED(status))
    tcrun_msg("rank %d (pid %d) exited with code %d", t->rank0 + r, (int)rk->pid, code);
  else
    tcrun_msg("rank %d (pid %d) was killed by signal %d (%s)%s", t->rank0 + r,
              (int)rk->pid, WTERMSIG(status), tcrun_signame(WTERMSIG(status)),
              WCOREDUMP(status) ? " (core dumped)" : "");
  if (t->nlive > 0)
    tcrun_msg("stopping the other %d rank%s (SIGTERM, then SIGKILL after "
              "%g s)", t->nlive, t->nlive == 1 ? "" : "s", t->o.grace);
  tcrun_stop(t, SIGTERM, code);
}

/* Reaps every exited child without blocking (ranks, and as a subreaper
 * also orphaned descendants, which are ignored). */
static void tcrun_reap(tcrun_t *t) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;
    for (int r = 0; r < t->o.nranks; r++)
      if (t->ranks[r].live && t->ranks[r].pid == pid) {
        tcrun_rank_ended(t, r, status);
        break;
      }
  }
}

/* Drains the self-pipe and acts on each signal received. */
static void tcrun_handle_signals(tcrun_t *t) {
  unsigned char sigs[64];
  ssize_t n;
  while ((n = read(tcrun_sigpipe[0], sigs, sizeof sigs)) > 0) {
    for (ssize_t k = 0; k < n; k++) {
      int sig = sigs[k];
      if (sig == SIGCHLD) {
        tcrun_reap(t);
      } else {
        if (!t->stopping)
          tcrun_msg("received %s; forwarding it to %d rank%s", tcrun_signame(sig),
                    t->nlive, t->nlive == 1 ? "" : "s");
        tcrun_stop(t, sig, 128 + sig);
      }
    }
  }
}

/* Milliseconds until `deadline` for poll (rounded up; 0 if past). */
static int tcrun_ms_until(double deadline, double now) {
  double ms = ceil((deadline - now) * 1000.0);
  if (ms < 0) return 0;
  return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* The main loop: waits for rank exits, output, signals and deadlines until
 * every rank is reaped and every output pipe is drained. */
static void tcrun_loop(tcrun_t *t, double start) {
  int n = t->o.nranks;
  struct pollfd *pfd = calloc((size_t)(1 + 2 * n), sizeof *pfd);
  tcrun_stream_t **owner = calloc((size_t)(1 + 2 * n), sizeof *owner);
  int *owner_rank = calloc((size_t)(1 + 2 * n), sizeof *owner_rank);
  if (!pfd || !owner || !owner_rank) { /* cannot supervise: kill them all */
    tcrun_msg("out of memory");
    tcrun_stop(t, SIGKILL, 1);
    t->killed = 1;
    goto out;
  }
  double drain_until = -1, timeout_at = t->o.timeout > 0 ? start + t->o.timeout : -1;
  for (;;) {
    double now = tc__now();
    int nfds = 0;
    pfd[nfds++] = (struct pollfd){.fd = tcrun_sigpipe[0], .events = POLLIN};
    for (int r = 0; r < n; r++) {
      tcrun_stream_t *ss[2] = {&t->ranks[r].out, &t->ranks[r].err};
      for (int k = 0; k < 2; k++)
        if (t->o.tag_output && ss[k]->fd >= 0) {
          owner[nfds] = ss[k];
          owner_rank[nfds] = r;
          pfd[nfds++] = (struct pollfd){.fd = ss[k]->fd, .events = POLLIN};
        }
    }
    /* stopping: wait for what the ranks left in their groups, up to kill_at */
    int waiting_leftovers = t->nlive == 0 && t->stopping && !t->killed &&
                            tcrun_leftovers(t);
    if (t->nlive == 0 && !waiting_leftovers) {
      if (nfds == 1) break; /* all done */
      /* ranks are gone but something of theirs still holds a pipe open */
      if (drain_until < 0) drain_until = now + (t->o.grace > 1 ? t->o.grace : 1);
      if (now >= drain_until) {
        tc__log(1, "tcrun: a rank's descendant still holds its output pipe "
                   "open; not waiting for it");
        for (int k = 1; k < nfds; k++) tcrun_stream_close(t, owner[k], owner_rank[k]);
        break;
      }
    }
    if (!t->stopping && timeout_at >= 0 && now >= timeout_at) {
      tcrun_msg("--timeout of %g s expired with %d rank%s still running; "
                "stopping them", t->o.timeout, t->nlive, t->nlive == 1 ? "" : "s");
      tcrun_stop(t, SIGTERM, 124);
    }
    if (t->stopping && !t->killed && (t->nlive > 0 || waiting_leftovers) &&
        now >= t->kill_at) {
      for (int r = 0; r < n; r++)
        if (t->ranks[r].live)
          tcrun_msg("rank %d (pid %d) did not stop within %g s; sending SIGKILL",
                    t->rank0 + r, (int)t->ranks[r].pid, t->o.grace);
      if (t->nlive == 0)
        tcrun_msg("processes left behind by the ranks did not stop within "
                  "%g s; sending SIGKILL", t->o.grace);
      tcrun_signal_groups(t, SIGKILL, 1);
      t->killed = 1;
      continue; /* recompute the state */
    }
    int wait_ms = -1;
    if (!t->stopping && timeout_at >= 0) wait_ms = tcrun_ms_until(timeout_at, now);
    if (t->stopping && !t->killed && (t->nlive > 0 || waiting_leftovers)) {
      int ms = tcrun_ms_until(t->kill_at, now);
      if (wait_ms < 0 || ms < wait_ms) wait_ms = ms;
    }
    if (t->nlive == 0 && !waiting_leftovers && drain_until >= 0) {
      int ms = tcrun_ms_until(drain_until, now);
      if (wait_ms < 0 || ms < wait_ms) wait_ms = ms;
    }
    int rc = poll(pfd, (nfds_t)nfds, wait_ms);
    if (rc < 0) {
      if (errno == EINTR) continue;
      tcrun_msg("poll: %s", strerror(errno));
      tcrun_stop(t, SIGKILL, 1);
      t->killed = 1;
      break;
    }
    for (int k = 1; k < nfds; k++)
      if (pfd[k].revents) tcrun_stream_read(t, owner[k], owner_rank[k]);
    if (pfd[0].revents) tcrun_handle_signals(t);
  }
out:
  /* only after poll failure or out of memory (the ranks were SIGKILLed):
   * reap them, blocking */
  while (t->nlive > 0) {
    int st;
    pid_t pid = waitpid(-1, &st, 0);
    if (pid < 0 && errno != EINTR) break;
    for (int r = 0; pid > 0 && r < n; r++)
      if (t->ranks[r].live && t->ranks[r].pid == pid) tcrun_rank_ended(t, r, st);
  }
  free(pfd);
  free(owner);
  free(owner_rank);
}

/* ---- several nodes: joining through node 0's store ---- */

/* A signal other than SIGCHLD that tcrun received meanwhile (reaping
 * children on SIGCHLD), or 0. For the waits outside the main loop. */
static int tcrun_pending_signal(tcrun_t *t) {
  unsigned char sigs[64];
  ssize_t n;
  int got = 0;
  while ((n = read(tcrun_sigpipe[0], sigs, sizeof sigs)) > 0)
    for (ssize_t k = 0; k < n; k++) {
      if (sigs[k] == SIGCHLD) tcrun_reap(t);
      else if (!got) got = sigs[k];
    }
  return got;
}

/* Waits until every key exists in the store, in slices of a second so that
 * a signal to tcrun ends the wait. Returns 0; -1 past `deadline` or on a
 * store error (reported, naming `what`); 128+S on signal S. */
static int tcrun_store_wait(tcrun_t *t, tc_store_t *st, const char *const *keys,
                            size_t nkeys, double deadline, const char *what) {
  for (;;) {
    int sig = tcrun_pending_signal(t);
    if (sig) {
      tcrun_msg("received %s while waiting for %s; exiting", tcrun_signame(sig), what);
      return 128 + sig;
    }
    double left = deadline - tc__now();
    if (left <= 0) {
      tcrun_msg("timed out after --join-timeout %g s waiting for %s", t->o.join_timeout, what);
      return -1;
    }
    int rc = tc_store_wait(st, keys, nkeys, left < 1 ? left : 1);
    if (rc == TC_OK) return 0;
    if (rc != TC_ERR_TIMEOUT) {
      tcrun_msg("the store at %s:%d failed while waiting for %s: %s", tcrun_master(t),
                t->o.port, what, tc_last_error()[0] ? tc_last_error() : tc_strerror(rc));
      return -1;
    }
  }
}

/* The store keys of node j ("tcrun/node/<j>", "tcrun/done/<j>"). */
static char **tcrun_node_keys(int nnodes, const char *kind) {
  char **keys = calloc((size_t)nnodes, sizeof *keys);
  for (int j = 0; keys && j < nnodes; j++) {
    char k[64];
    snprintf(k, sizeof k, "tcrun/%s/%d", kind, j);
    if (!(keys[j] = strdup(k))) {
      for (int i = 0; i < j; i++) free(keys[i]);
      free(keys);
      return NULL;
    }
  }
  return keys;
}

static void tcrun_free_keys(char **keys, int n) {
  for (int j = 0; keys && j < n; j++) free(keys[j]);
  free(keys);
}

/* Joins the other nodes (--nnodes > 1): connects to node 0's store,
 * publishes this node's rank count, waits for every node's, and sets
 * t->rank0, t->world and t->run_id. Returns 0 with *out the store client
 * (kept for the exit), else tcrun's exit status (reported). */
static int tcrun_join(tcrun_t *t, tc_store_t **out) {
  const tcrun_opts_t *o = &t->o;
  double deadline = tc__now() + o->join_timeout;
  tc_store_t *st = NULL;
  char **keys = NULL;
  int code = 1, rc;
  *out = NULL;
  for (;;) { /* connect, a second at a time, so that a signal ends it */
    int sig = tcrun_pending_signal(t);
    if (sig) {
      tcrun_msg("received %s while connecting to node 0's store; exiting", tcrun_signame(sig));
      return 128 + sig;
    }
    double left = deadline - tc__now();
    rc = tc_store_tcp_connect(o->master_addr, o->port, left < 1 ? (left > 0 ? left : 0.01) : 1, &st);
    if (rc == TC_OK) break;
    if (left <= 1) {
      tcrun_msg("node %d cannot reach node 0's store at %s:%d within --join-timeout %g s "
                "(%s); start node 0's tcrun with --master-addr an address of its host "
                "that this host can reach, and the same --port", o->node_rank,
                o->master_addr, o->port, o->join_timeout,
                tc_last_error()[0] ? tc_last_error() : tc_strerror(rc));
      return 1;
    }
  }
  char key[64], val[64];
  int64_t claims = 0;
  snprintf(key, sizeof key, "tcrun/claim/%d", o->node_rank);
  if ((rc = tc_store_add(st, key, 1, &claims)) != TC_OK) goto store_failed;
  if (claims != 1) {
    tcrun_msg("node rank %d is already taken: another tcrun joined this job (the store "
              "at %s:%d) with --node-rank %d; give every host its own --node-rank",
              o->node_rank, o->master_addr, o->port, o->node_rank);
    goto out;
  }
  if (o->node_rank == 0) {
    snprintf(val, sizeof val, "tcrun-%d", (int)getpid());
    if ((rc = tc_store_set(st, "tcrun/run_id", val, strlen(val))) != TC_OK) goto store_failed;
  }
  snprintf(key, sizeof key, "tcrun/node/%d", o->node_rank);
  snprintf(val, sizeof val, "%d %d", o->nranks, o->nnodes);
  if ((rc = tc_store_set(st, key, val, strlen(val))) != TC_OK) goto store_failed;
  if (!(keys = tcrun_node_keys(o->nnodes, "node"))) {
    tcrun_msg("out of memory");
    goto out;
  }
  char what[96];
  snprintf(what, sizeof what, "all %d nodes to join", o->nnodes);
  int w = tcrun_store_wait(t, st, (const char *const *)keys, (size_t)o->nnodes, deadline, what);
  if (w != 0) {
    code = w < 0 ? 1 : w;
    goto out;
  }
  t->rank0 = t->world = 0;
  for (int j = 0; j < o->nnodes; j++) {
    void *v = NULL;
    size_t len = 0;
    if ((rc = tc_store_get(st, keys[j], &v, &len, 1.0)) != TC_OK) goto store_failed;
    char text[64] = "";
    memcpy(text, v, len < sizeof text - 1 ? len : sizeof text - 1);
    tc_free(v);
    int np = 0, nn = 0;
    if (sscanf(text, "%d %d", &np, &nn) != 2 || np < 1 || np > TCRUN_MAX_RANKS) {
      tcrun_msg("node %d published '%s' in the store at %s:%d, not its rank count (another "
                "program's store?)", j, text, o->master_addr, o->port);
      goto out;
    }
    if (nn != o->nnodes) {
      tcrun_msg("node %d was started with --nnodes %d, this node (%d) with --nnodes %d; "
                "start every node with the same --nnodes", j, nn, o->node_rank, o->nnodes);
      goto out;
    }
    if (j < o->node_rank) t->rank0 += np;
    t->world += np;
  }
  const char *rid = "tcrun/run_id";
  w = tcrun_store_wait(t, st, &rid, 1, deadline, "node 0's run id");
  if (w != 0) {
    code = w < 0 ? 1 : w;
    goto out;
  }
  void *v = NULL;
  size_t len = 0;
  if ((rc = tc_store_get(st, rid, &v, &len, 1.0)) != TC_OK) goto store_failed;
  /* node 0's id replaces this node's own (its NUL included: a shorter id
   * must not keep the end of the longer one) */
  const size_t n = len < sizeof t->run_id - 1 ? len : sizeof t->run_id - 1;
  memcpy(t->run_id, v, n);
  t->run_id[n] = '\0';
  tc_free(v);
  tc__log(2, "tcrun: node %d of %d: ranks %d..%d of %d, run id %s", o->node_rank,
          o->nnodes, t->rank0, t->rank0 + o->nranks - 1, t->world, t->run_id);
  tcrun_free_keys(keys, o->nnodes);
  *out = st;
  return 0;
store_failed:
  tcrun_msg("node %d: the store at %s:%d failed: %s", o->node_rank, o->master_addr, o->port,
            tc_last_error()[0] ? tc_last_error() : tc_strerror(rc));
out:
  tcrun_free_keys(keys, o->nnodes);
  tc_store_release(st);
  return code;
}

/* After this node's ranks ended: marks it done in the store; node 0 then
 * waits (up to --join-timeout) until every node is done before its store
 * goes away. Returns 0, or 1/128+S when node 0 stopped waiting. */
static int tcrun_leave(tcrun_t *t, tc_store_t *st) {
  char key[64];
  snprintf(key, sizeof key, "tcrun/done/%d", t->o.node_rank);
  if (tc_store_set(st, key, "1", 1) != TC_OK) {
    tcrun_msg("node %d: could not mark itself done in the store at %s:%d: %s", t->o.node_rank,
              t->o.master_addr, t->o.port, tc_last_error());
    return t->o.node_rank == 0 ? 1 : 0; /* others: node 0 may already be gone */
  }
  if (t->o.node_rank != 0) return 0;
  char **keys = tcrun_node_keys(t->o.nnodes, "done");
  if (!keys) return 1;
  int w = tcrun_store_wait(t, st, (const char *const *)keys, (size_t)t->o.nnodes,
                           tc__now() + t->o.join_timeout,
                           "the other nodes to finish (node 0 hosts their store)");
  tcrun_free_keys(keys, t->o.nnodes);
  return w < 0 ? 1 : w;
}

/* Entry point: parse, host the store, start the ranks, supervise them. */
int main(int argc, char **argv) {
  tcrun_t t;
  memset(&t, 0, sizeof t);
  tcrun_parse_args(argc, argv, &t.o);
  tcrun_ensure_std_fds();
  t.first_private_fd = tcrun_first_private_fd();
  long lim = sysconf(_SC_OPEN_MAX);
  t.fd_limit = lim < 0 || lim > 65536 ? 65536 : (int)lim;
  t.devnull = -1;
  sigprocmask(SIG_SETMASK, NULL, &t.orig_mask);
  if (tcrun_setup_signals(&t) < 0) {
    tcrun_msg("cannot set up signal handling: %s", strerror(errno));
    return 1;
  }
  t.devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
#ifdef PR_SET_CHILD_SUBREAPER
  prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); /* to see leftovers exit */
#endif

  /* The store's thread must not take our signals: start it with them
   * blocked, so the handlers always run on this thread. */
  tc_store_server_t *server = NULL;
  sigset_t old;
  pthread_sigmask(SIG_BLOCK, &t.handled, &old);
  int src = t.o.node_rank == 0 ? tc_store_server_start(tcrun_master(&t), t.o.port, &server)
                                : TC_OK;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (src != TC_OK) {
    tcrun_msg("cannot start the store server on %s:%d: %s%s", tcrun_master(&t),
              t.o.port, tc_last_error()[0] ? tc_last_error() : tc_strerror(src),
              t.o.master_addr ? " (--master-addr must be an address of node 0's host; "
                                "is the port taken?)" : "");
    return 1;
  }
  int port = server ? tc_store_server_port(server) : t.o.port;
  t.world = t.o.nranks;
  snprintf(t.run_id, sizeof t.run_id, "tcrun-%d", (int)getpid());
  tc_store_t *node_store = NULL; /* --nnodes > 1: our client of node 0's store */
  if (t.o.nnodes > 1) {
    int jc = tcrun_join(&t, &node_store);
    if (jc != 0) {
      if (server) tc_store_server_stop(server);
      return jc;
    }
  }

  double start = tc__now();
  t.ranks = calloc((size_t)t.o.nranks, sizeof *t.ranks);
  if (!t.ranks) {
    tcrun_msg("out of memory");
    if (server) tc_store_server_stop(server);
    tc_store_release(node_store);
    return 1;
  }
  tcrun_plan_binding(&t);
  for (int r = 0; r < t.o.nranks; r++) {
    t.ranks[r].out.fd = t.ranks[r].err.fd = -1;
    t.ranks[r].env = tcrun_build_env(&t, r, port);
    if (!t.ranks[r].env) {
      tcrun_msg("out of memory");
      t.exit_code = 1;
      break;
    }
  }
  for (int r = 0; r < t.o.nranks && t.exit_code == 0; r++)
    if (tcrun_spawn(&t, r) < 0) tcrun_stop(&t, SIGTERM, t.exit_code);
  tcrun_loop(&t, start);
  /* every rank has exited: remove the shared-memory segments that ranks
   * killed during creation left in /dev/shm (any dead creator's) */
  int swept = tc__shm_sweep();
  if (swept > 0) tc__log(2, "tcrun: removed %d leftover shared-memory segments", swept);

  if (node_store) {
    int lc = tcrun_leave(&t, node_store);
    if (t.exit_code == 0) t.exit_code = lc;
    tc_store_release(node_store);
  }
  if (server) tc_store_server_stop(server);
  for (int r = 0; r < t.o.nranks; r++) {
    tcrun_free_env(t.ranks[r].env);
    tcrun_stream_close(&t, &t.ranks[r].out, r);
    tcrun_stream_close(&t, &t.ranks[r].err, r);
  }
  free(t.ranks);
  if (t.devnull >= 0) close(t.devnull);
  return t.exit_code;
}
