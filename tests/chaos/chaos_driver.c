/* chaos_driver.c -- chaos trials for the `cpu` backend (make chaos,
 * make chaos-short).
 *
 * Each trial starts 2-8 real ranks (chaos_worker, fork + exec, one process
 * group) over a TCPStore this driver hosts, on shared memory or TCP
 * (TORCHCOMMS_CPU_TRANSPORT), each running a seeded random mix of every
 * operation and checking every result exactly. Once every rank reported
 * "ready" (its communicator is created; read from its stdout pipe, never
 * guessed with a sleep), the driver waits a random delay (that delay only
 * picks the moment), then sends one random rank SIGKILL or SIGSTOP. It then
 * asserts:
 *   - every survivor reports an error and exits with status 3 within the
 *     deadline (kill moment + timeout + margin); none hangs, none reports a
 *     wrong result, none crashes;
 *   - SIGKILL: the error is TC_ERR_REMOTE; SIGSTOP: TC_ERR_TIMEOUT, or
 *     TC_ERR_REMOTE once another survivor gave up and exited;
 *   - the error text names a peer: the victim ("peer V"), or (a cascade) a
 *     survivor that had already failed, or with a timeout a survivor that was
 *     itself blocked behind the victim;
 *   - nothing is left behind: no /dev/shm/torchcomms-<hash of the trial's
 *     communicator name>-* entry, no process in the trial's process group
 *     (the stopped victim is SIGKILLed at the end).
 * Detection time = survivor's error time - kill time (CLOCK_MONOTONIC in
 * both processes). A summary gives medians and maxima for kill and stop.
 *
 * --create kills the victim (SIGKILL) at a random moment while the ranks
 * are still creating their communicator (0..--create-window s after the
 * start), for the /dev/shm cleanup of failed creation; survivors must fail
 * (in creation or in the first operations) within the deadline and leave
 * nothing behind. --clean K first runs K trials without a victim (--ops 300,
 * finalize): every rank must exit 0.
 *
 *   chaos_driver [--trials N] [--seed S] [--min-ranks 2] [--max-ranks 8]
 *                [--transport mix|shm|tcp] [--signal mix|kill|stop]
 *                [--timeout 3] [--margin 3] [--max-delay 0.5] [--create]
 *                [--create-window 0.04] [--clean K] [--max-count C]
 *                [--worker PATH] [--verbose] */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chaos_stats.h"
#include "torchcomms.h"
#include "transport/shm.h" /* tc__shm_sweep */

extern char **environ;

#define MAXR 8

typedef struct {
  int trials, min_ranks, max_ranks, create, clean, verbose;
  unsigned long long seed;
  const char *transport, *signal, *worker;
  double timeout, margin, max_delay, create_window;
  size_t max_count;
} cfg_t;

typedef struct {
  pid_t pid;
  int fd; /* its stdout+stderr, -1 at EOF */
  char out[32768];
  size_t len;
  int status, reaped;
  double t_ready, t_err, t_exit;
  char err_status[64], err_msg[2048];
  int wrong, noerror, done;
} rank_t;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* FNV-1a of a communicator name: the "<hash>" in its /dev/shm segment names
 * ("/torchcomms-<hash>-<token>-<rank>", src/transport/shm_setup.c). */
static uint32_t name_hash(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

/* ---- the ranks' output ---- */

static void parse_line(rank_t *r, const char *line) {
  if (strncmp(line, "CHAOS ", 6)) return;
  line += 6;
  if (!strncmp(line, "ready ", 6)) {
    r->t_ready = atof(line + 6);
  } else if (!strncmp(line, "error ", 6) && r->t_err == 0) {
    /* error <t> <step> <op> <STATUS> <message> */
    char op[64];
    int off = 0;
    if (sscanf(line + 6, "%lf %*s %63s %63s %n", &r->t_err, op, r->err_status, &off) >= 3)
      snprintf(r->err_msg, sizeof r->err_msg, "%s: %s", op, line + 6 + off);
  } else if (!strncmp(line, "wrong ", 6)) {
    r->wrong = 1;
  } else if (!strncmp(line, "noerror", 7)) {
    r->noerror = 1;
  } else if (!strncmp(line, "done", 4)) {
    r->done = 1;
  }
}

/* Reads what is there; parses complete new lines. At EOF: fd = -1. */
static void drain(rank_t *r) {
  char buf[4096];
  ssize_t n = read(r->fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    close(r->fd);
    r->fd = -1;
    r->t_exit = now();
    return;
  }
  size_t start = r->len;
  while (start > 0 && r->out[start - 1] != '\n') start--;
  size_t room = sizeof r->out - 1 - r->len;
  size_t take = (size_t)n < room ? (size_t)n : room;
  memcpy(r->out + r->len, buf, take);
  r->len += take;
  r->out[r->len] = 0;
  for (char *p = r->out + start, *nl; (nl = strchr(p, '\n')); p = nl + 1) {
    *nl = 0;
    parse_line(r, p);
    *nl = '\n';
  }
}

/* Waits for output until `until` (or until stop(ctx) holds). */
static void pump(rank_t *rk, int n, double until, int (*stop)(rank_t *, int, void *),
                 void *ctx) {
  for (;;) {
    if (stop && stop(rk, n, ctx)) return;
    double left = until - now();
    if (left <= 0) return;
    struct pollfd pf[MAXR];
    int idx[MAXR], np = 0;
    for (int i = 0; i < n; i++)
      if (rk[i].fd >= 0) {
        pf[np] = (struct pollfd){.fd = rk[i].fd, .events = POLLIN};
        idx[np++] = i;
      }
    if (np == 0) return;
    int ms = (int)(left * 1000) + 1;
    int k = poll(pf, (nfds_t)np, ms);
    if (k < 0 && errno != EINTR) return;
    for (int j = 0; j < np && k > 0; j++)
      if (pf[j].revents) drain(&rk[idx[j]]);
  }
}

static int all_ready(rank_t *rk, int n, void *ctx) {
  (void)ctx;
  for (int i = 0; i < n; i++)
    if (rk[i].t_ready == 0 && rk[i].fd >= 0) return 0;
  return 1;
}

static int any_ended(rank_t *rk, int n, void *ctx) {
  (void)ctx;
  for (int i = 0; i < n; i++)
    if (rk[i].fd < 0 || rk[i].t_err > 0 || rk[i].wrong) return 1;
  return 0;
}

/* All ranks but *(int *)ctx (the stopped victim; -1: none) closed output. */
static int others_closed(rank_t *rk, int n, void *ctx) {
  int skip = *(int *)ctx;
  for (int i = 0; i < n; i++)
    if (i != skip && rk[i].fd >= 0) return 0;
  return 1;
}

/* Reaps pid by `until`; SIGKILLs it past then. Returns 1 if it had to. */
static int reap(rank_t *r, double until) {
  if (r->reaped) return 0;
  int killed = 0;
  for (;;) {
    pid_t w = waitpid(r->pid, &r->status, WNOHANG);
    if (w == r->pid || (w < 0 && errno != EINTR)) break;
    if (now() > until && !killed) {
      kill(r->pid, SIGKILL);
      killed = 1;
      until = now() + 10;
    } else if (killed && now() > until) {
      break;
    }
    poll(NULL, 0, 1); /* a bounded poll for the exit, not a synchronisation */
  }
  r->reaped = 1;
  return killed;
}

/* ---- one trial ---- */

static pid_t spawn(const cfg_t *c, int rank, int n, int port, const char *name,
                   unsigned long long seed, int ops, const char *transport,
                   double create_timeout, pid_t pgid, int *fd) {
  char a[12][64];
  snprintf(a[8], 64, "%d", ops > 0); /* clean trials prove the checks too */
  snprintf(a[0], 64, "%d", rank);
  snprintf(a[1], 64, "%d", n);
  snprintf(a[2], 64, "%d", port);
  snprintf(a[3], 64, "%llu", seed);
  snprintf(a[4], 64, "%g", c->timeout);
  snprintf(a[5], 64, "%d", ops);
  snprintf(a[6], 64, "%zu", c->max_count);
  snprintf(a[7], 64, "%g", create_timeout);
  char *argv[] = {(char *)c->worker, "--rank", a[0], "--size", a[1], "--port", a[2],
                  "--name", (char *)name, "--seed", a[3], "--timeout", a[4],
                  "--ops", a[5], "--max-count", a[6], "--create-timeout", a[7],
                  "--selftest", a[8], NULL};
  static char envbuf[64];
  snprintf(envbuf, sizeof envbuf, "TORCHCOMMS_CPU_TRANSPORT=%s", transport);
  size_t ne = 0;
  while (environ[ne]) ne++;
  char **envp = calloc(ne + 2, sizeof *envp);
  size_t k = 0;
  for (size_t i = 0; i < ne; i++)
    if (strncmp(environ[i], "TORCHCOMMS_CPU_TRANSPORT=", 25)) envp[k++] = environ[i];
  envp[k++] = envbuf;
  int p[2];
  if (pipe2(p, O_CLOEXEC)) {
    perror("pipe");
    exit(2);
  }
  pid_t pid = fork();
  if (pid == 0) { /* only async-signal-safe calls until exec */
    setpgid(0, pgid);
    dup2(p[1], 1);
    dup2(p[1], 2);
    execve(c->worker, argv, envp);
    _exit(127);
  }
  if (pid < 0) {
    perror("fork");
    exit(2);
  }
  setpgid(pid, pgid ? pgid : pid); /* also here: no race with the child */
  close(p[1]);
  free(envp);
  *fd = p[0];
  return pid;
}

/* The peers a message names ("peer 3", "peer 3, 5" in "also lost: ..."). */
static unsigned named_peers(const char *msg) {
  unsigned set = 0;
  for (const char *p = msg; (p = strstr(p, "peer ")); ) {
    p += 5;
    while (*p >= '0' && *p <= '9') {
      int v = atoi(p);
      if (v >= 0 && v < 32) set |= 1u << v;
      while (*p >= '0' && *p <= '9') p++;
      if (p[0] == ',' && p[1] == ' ' && p[2] >= '0' && p[2] <= '9') p += 2;
    }
  }
  return set;
}

static int shm_leftovers(uint32_t hash, int remove_them) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "torchcomms-%08x-", hash);
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int found = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, prefix, strlen(prefix))) continue;
    found++;
    printf("    leftover /dev/shm/%s\n", e->d_name);
    if (remove_them) {
      char path[512];
      snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
      unlink(path);
    }
  }
  closedir(d);
  return found;
}

/* Runs trial t; returns 1 when it passed. */
static int trial(const cfg_t *c, int t, int port, chaos_stats_t *st) {
  uint64_t r = mix(c->seed * 7777 + (uint64_t)t);
  int clean = t < c->clean;
  int n = c->min_ranks + (int)(r % (uint64_t)(c->max_ranks - c->min_ranks + 1));
  r = mix(r);
  int combo = clean ? t : t - c->clean; /* shm/tcp x kill/stop in turn */
  const char *tp = !strcmp(c->transport, "mix") ? (combo % 2 ? "tcp" : "shm") : c->transport;
  int sig = !strcmp(c->signal, "mix") ? ((combo / 2) % 2 ? SIGSTOP : SIGKILL)
            : !strcmp(c->signal, "stop") ? SIGSTOP : SIGKILL;
  if (c->create) sig = SIGKILL;
  int victim = clean ? -1 : (int)(r % (uint64_t)n);
  r = mix(r);
  double delay = (double)(r % 1000001) / 1e6 * (c->create ? c->create_window : c->max_delay);
  unsigned long long seed = mix(r) % 1000000007ull;
  char name[96];
  snprintf(name, sizeof name, "chaos-%d-%d", (int)getpid(), t);
  uint32_t hash = name_hash(name);
  double create_timeout = c->create ? c->timeout : 30;

  rank_t *rk = calloc(MAXR, sizeof *rk);
  pid_t pgid = 0;
  double t0 = now();
  for (int i = 0; i < n; i++) {
    rk[i].pid = spawn(c, i, n, port, name, seed, clean ? 300 : 0, tp, create_timeout,
                      pgid, &rk[i].fd);
    if (!pgid) pgid = rk[i].pid;
  }
  char fail[512] = "";
  double t_kill = 0;
  const char *signame = clean ? "none" : sig == SIGKILL ? "kill" : "stop";
  if (!c->create) {
    pump(rk, n, t0 + 60, all_ready, NULL);
    for (int i = 0; i < n && !fail[0]; i++)
      if (rk[i].t_ready == 0)
        snprintf(fail, sizeof fail, "rank %d did not become ready", i);
  }
  int stopvictim = -1;
  if (!fail[0] && !clean) {
    /* the random delay that picks the moment; ends early if a rank fails */
    pump(rk, n, now() + delay, any_ended, NULL);
    for (int i = 0; i < n && !fail[0]; i++)
      if (rk[i].fd < 0 || rk[i].t_err > 0 || rk[i].wrong)
        snprintf(fail, sizeof fail, "rank %d ended before the kill", i);
    t_kill = now();
    kill(rk[victim].pid, sig);
    if (sig == SIGSTOP) stopvictim = victim;
  }
  double deadline = (clean ? t0 + 120 : t_kill + (c->create ? create_timeout : c->timeout) +
                     c->margin);
  /* every survivor's output closes when it exits; +10 s for teardown */
  pump(rk, n, deadline + 10, others_closed, &stopvictim);
  if (stopvictim >= 0) kill(rk[stopvictim].pid, SIGKILL);
  int hung = 0;
  for (int i = 0; i < n; i++) {
    if (rk[i].fd >= 0 && i != stopvictim) hung |= 1 << i;
    hung |= reap(&rk[i], now() + (i == stopvictim ? 10 : 0.5)) << i;
    if (rk[i].fd >= 0) {
      pump(&rk[i], 1, now() + 1, NULL, NULL);
      if (rk[i].fd >= 0) close(rk[i].fd);
    }
  }
  /* leftovers: processes of the group, then segments of this communicator */
  int left_procs = kill(-pgid, 0) == 0;
  if (left_procs) {
    kill(-pgid, SIGKILL);
    while (waitpid(-pgid, NULL, WNOHANG) > 0) {
    }
  }
  /* as a launcher does (tcrun): remove the segments of dead creators (ranks
   * killed during creation, --create); what is left after it is a leak */
  tc__shm_sweep();
  int left_shm = shm_leftovers(hash, 1);
  st->leftover_shm += left_shm;
  st->leftover_procs += left_procs;

  /* verdicts */
  int survivors = 0, erred = 0, named_victim = 0;
  double worst = 0;
  for (int i = 0; i < n; i++) {
    rank_t *x = &rk[i];
    char why[400] = "";
    if (hung & (1 << i)) {
      snprintf(why, sizeof why, "did not exit by the deadline (hang?)");
    } else if (x->wrong) {
      snprintf(why, sizeof why, "reported a wrong result");
    } else if (i == victim) {
      if (!WIFSIGNALED(x->status) || WTERMSIG(x->status) != SIGKILL)
        snprintf(why, sizeof why, "the victim was not ended by SIGKILL (status 0x%x)",
                 x->status);
    } else if (clean) {
      if (!WIFEXITED(x->status) || WEXITSTATUS(x->status) != 0 || !x->done)
        snprintf(why, sizeof why, "no clean exit (status 0x%x)", x->status);
    } else {
      survivors++;
      double dt = x->t_err - t_kill;
      unsigned named = named_peers(x->err_msg);
      int is_timeout = !strcmp(x->err_status, "TC_ERR_TIMEOUT");
      int is_remote = !strcmp(x->err_status, "TC_ERR_REMOTE");
      unsigned ok_names = victim >= 0 ? 1u << victim : 0;
      for (int j = 0; j < n; j++) /* a cascade: a survivor that failed first */
        if (j != victim && j != i && rk[j].t_err > 0 &&
            (rk[j].t_err <= x->t_err || is_timeout))
          ok_names |= 1u << j;
      if (!WIFEXITED(x->status) || WEXITSTATUS(x->status) != 3)
        snprintf(why, sizeof why, "exit status 0x%x instead of an error exit (3)",
                 x->status);
      else if (x->t_err == 0)
        snprintf(why, sizeof why, "exited without reporting an error");
      else if (x->t_err < t_kill)
        snprintf(why, sizeof why, "failed %.3f s before the kill", t_kill - x->t_err);
      else if (dt > (c->create ? create_timeout : c->timeout) + c->margin)
        snprintf(why, sizeof why, "detected after %.3f s (deadline %.1f s)", dt,
                 (c->create ? create_timeout : c->timeout) + c->margin);
      else if (!c->create && sig == SIGKILL && !is_remote)
        snprintf(why, sizeof why, "a killed peer reported as %s, not TC_ERR_REMOTE",
                 x->err_status);
      else if (!c->create && !is_remote && !is_timeout)
        snprintf(why, sizeof why, "a stopped peer reported as %s", x->err_status);
      else if (!c->create && !(named & ok_names))
        snprintf(why, sizeof why, "the error names no plausible peer (victim %d)",
                 victim);
      if (!why[0]) {
        erred++;
        if (named & (1u << victim)) named_victim++;
        if (dt > worst) worst = dt;
        chaos_stats_add(st, c->create ? 2 : sig == SIGKILL ? 0 : 1, dt);
      }
    }
    if (why[0]) {
      if (!fail[0]) snprintf(fail, sizeof fail, "rank %d %s", i, why);
      printf("    rank %d: %s\n", i, why);
    }
  }
  st->survivors += survivors;
  st->survivors_erred += erred;
  st->named_victim += named_victim;
  if (left_shm) snprintf(fail + strlen(fail), sizeof fail - strlen(fail),
                         "%s%d /dev/shm segment(s) left", fail[0] ? "; " : "", left_shm);
  if (left_procs) snprintf(fail + strlen(fail), sizeof fail - strlen(fail),
                           "%sprocesses left in the group", fail[0] ? "; " : "");
  int ok = !fail[0];
  char when[48] = "";
  if (c->create) { /* how far creation had got when the victim died */
    int ready = 0;
    for (int i = 0; i < n; i++) ready += rk[i].t_ready > 0 && rk[i].t_ready < t_kill;
    snprintf(when, sizeof when, " (%d of %d ready)", ready, n);
    st->create_trials++;
    st->create_before_ready += ready < n;
  }
  printf("trial %3d: %d ranks %-3s %-4s victim %2d after %.3f s%s: %d/%d survivors "
         "erred (named the victim: %d), slowest %.3f s, leftovers %d  %s%s\n",
         t, n, tp, signame, victim, delay, when, erred, survivors, named_victim, worst,
         left_shm + left_procs, ok ? "ok" : "FAIL: ", fail);
  if (!ok || c->verbose)
    for (int i = 0; i < n; i++)
      printf("  --- rank %d (pid %d)%s:\n%s", i, (int)rk[i].pid,
             i == victim ? " [victim]" : "", rk[i].out);
  fflush(stdout);
  free(rk);
  return ok;
}

static void usage(void) {
  fprintf(stderr, "usage: chaos_driver [--trials N] [--seed S] [--min-ranks 2] "
                  "[--max-ranks 8] [--transport mix|shm|tcp] [--signal mix|kill|stop] "
                  "[--timeout 3] [--margin 3] [--max-delay 0.5] [--create] "
                  "[--create-window 0.04] [--clean K] [--max-count C] [--worker PATH] "
                  "[--verbose]\n");
  exit(2);
}

int main(int argc, char **argv) {
  cfg_t c = {.trials = 12, .min_ranks = 2, .max_ranks = 8, .seed = 1,
             .transport = "mix", .signal = "mix", .timeout = 3, .margin = 3,
             .max_delay = 0.5, .create_window = 0.04, .max_count = 1 << 15};
  static char worker[4096];
  snprintf(worker, sizeof worker, "%s", argv[0]);
  char *slash = strrchr(worker, '/');
  snprintf(slash ? slash + 1 : worker, sizeof worker - (size_t)(slash ? slash + 1 - worker : 0),
           "chaos_worker");
  c.worker = worker;
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(k, "--create")) { c.create = 1; continue; }
    if (!strcmp(k, "--verbose")) { c.verbose = 1; continue; }
    if (!v) usage();
    i++;
    if (!strcmp(k, "--trials")) c.trials = atoi(v);
    else if (!strcmp(k, "--seed")) c.seed = strtoull(v, NULL, 0);
    else if (!strcmp(k, "--min-ranks")) c.min_ranks = atoi(v);
    else if (!strcmp(k, "--max-ranks")) c.max_ranks = atoi(v);
    else if (!strcmp(k, "--transport")) c.transport = v;
    else if (!strcmp(k, "--signal")) c.signal = v;
    else if (!strcmp(k, "--timeout")) c.timeout = atof(v);
    else if (!strcmp(k, "--margin")) c.margin = atof(v);
    else if (!strcmp(k, "--max-delay")) c.max_delay = atof(v);
    else if (!strcmp(k, "--create-window")) c.create_window = atof(v);
    else if (!strcmp(k, "--clean")) c.clean = atoi(v);
    else if (!strcmp(k, "--max-count")) c.max_count = strtoull(v, NULL, 0);
    else if (!strcmp(k, "--worker")) c.worker = v;
    else usage();
  }
  if (c.min_ranks < 2 || c.max_ranks > MAXR || c.min_ranks > c.max_ranks || c.trials < 0)
    usage();
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  tc_store_server_t *server;
  if (tc_store_server_start("127.0.0.1", 0, &server) != TC_OK) {
    fprintf(stderr, "chaos: store server: %s\n", tc_last_error());
    return 2;
  }
  int port = tc_store_server_port(server);
  printf("chaos: %d trials (+%d clean), %d-%d ranks, transport %s, signal %s%s, "
         "timeout %g s, margin %g s, seed %llu\n",
         c.trials, c.clean, c.min_ranks, c.max_ranks, c.transport,
         c.create ? "kill" : c.signal, c.create ? " during creation" : "", c.timeout,
         c.margin, c.seed);
  chaos_stats_t st;
  chaos_stats_init(&st);
  int failed = 0;
  double t0 = now();
  for (int t = 0; t < c.clean + c.trials; t++) failed += !trial(&c, t, port, &st);
  tc_store_server_stop(server);
  chaos_stats_print(&st, c.clean + c.trials, failed, now() - t0);
  chaos_stats_free(&st);
  return failed ? 1 : 0;
}
