/* test_tcrun.c -- tests of the tcrun launcher (tools/tcrun.c), run as a real
 * program (TC_BUILD_DIR "/tcrun") on small `sh -c` scripts, with its stdin,
 * stdout and stderr on pipes. Synchronisation is by what the ranks print,
 * never by sleeping; time bounds only assert that things terminate. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "runner.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "transport/shm_internal.h"

#define TCRUN_BIN TC_BUILD_DIR "/tcrun"
#define TCRUN_DEADLINE 30.0 /* seconds any single tcrun run may take */

/* A running tcrun with its stdio on pipes and the output captured so far. */
typedef struct {
  pid_t pid;
  int in_fd, out_fd, err_fd; /* -1 once closed */
  char *out, *err;           /* captured output, NUL-terminated */
  size_t out_len, err_len;
  double t0;                 /* start time (tc__now) */
  int code;                  /* exit code, 1000+S if killed by signal S */
  double secs;               /* wall time of the run */
} tcrun_proc_t;

/* Starts tcrun with args (NULL-terminated, without the program name). */
static void tcrun_start(tcrun_proc_t *p, const char *const *args) {
  int in[2], out[2], err[2];
  TC_ASSERT(pipe2(in, O_CLOEXEC) == 0);
  TC_ASSERT(pipe2(out, O_CLOEXEC) == 0);
  TC_ASSERT(pipe2(err, O_CLOEXEC) == 0);
  const char *argv[64] = {TCRUN_BIN};
  int n = 1;
  while (args[n - 1] && n < 63) {
    argv[n] = args[n - 1];
    n++;
  }
  argv[n] = NULL;
  memset(p, 0, sizeof *p);
  p->out = calloc(1, 1);
  p->err = calloc(1, 1);
  fflush(stdout);
  fflush(stderr);
  p->t0 = tc__now();
  p->pid = fork();
  TC_ASSERT(p->pid >= 0);
  if (p->pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    execv(TCRUN_BIN, (char *const *)argv);
    _exit(99);
  }
  close(in[0]);
  close(out[1]);
  close(err[1]);
  p->in_fd = in[1];
  p->out_fd = out[0];
  p->err_fd = err[0];
}

/* Appends what can be read from *fd to *buf within timeout_ms; closes *fd
 * at EOF. */
static void tcrun_read_into(int *fd, char **buf, size_t *len) {
  char chunk[65536];
  ssize_t n = read(*fd, chunk, sizeof chunk);
  if (n < 0 && errno == EINTR) return;
  if (n <= 0) {
    close(*fd);
    *fd = -1;
    return;
  }
  *buf = realloc(*buf, *len + (size_t)n + 1);
  TC_ASSERT(*buf != NULL);
  memcpy(*buf + *len, chunk, (size_t)n);
  *len += (size_t)n;
  (*buf)[*len] = '\0';
}

/* Waits up to timeout_ms for output and captures it. */
static void tcrun_pump(tcrun_proc_t *p, int timeout_ms) {
  struct pollfd f[2];
  int n = 0;
  if (p->out_fd >= 0) f[n++] = (struct pollfd){.fd = p->out_fd, .events = POLLIN};
  if (p->err_fd >= 0) f[n++] = (struct pollfd){.fd = p->err_fd, .events = POLLIN};
  if (n == 0) return;
  if (poll(f, (nfds_t)n, timeout_ms) <= 0) return;
  for (int k = 0; k < n; k++) {
    if (!f[k].revents) continue;
    if (f[k].fd == p->out_fd) tcrun_read_into(&p->out_fd, &p->out, &p->out_len);
    else tcrun_read_into(&p->err_fd, &p->err, &p->err_len);
  }
}

/* Number of (non-overlapping) occurrences of needle in hay. */
static int tcrun_count(const char *hay, const char *needle) {
  int c = 0;
  size_t l = strlen(needle);
  for (const char *s = strstr(hay, needle); s; s = strstr(s + l, needle)) c++;
  return c;
}

/* Captures output until stdout holds `count` copies of needle; fails the
 * test after TCRUN_DEADLINE seconds. */
static void tcrun_wait_for(tcrun_proc_t *p, const char *needle, int count) {
  double deadline = p->t0 + TCRUN_DEADLINE;
  while (tcrun_count(p->out, needle) < count) {
    if (tc__now() > deadline || (p->out_fd < 0 && p->err_fd < 0)) {
      kill(p->pid, SIGKILL);
      tc_test_fail(__FILE__, __LINE__, "waiting for %d x \"%s\"; stdout: "
                   "\"%s\" stderr: \"%s\"", count, needle, p->out, p->err);
    }
    tcrun_pump(p, 100);
  }
}

/* Closes tcrun's stdin, captures everything up to EOF and reaps it, filling
 * p->code and p->secs; fails the test after TCRUN_DEADLINE seconds. */
static void tcrun_finish(tcrun_proc_t *p) {
  if (p->in_fd >= 0) close(p->in_fd);
  p->in_fd = -1;
  double deadline = p->t0 + TCRUN_DEADLINE;
  int status;
  for (;;) {
    tcrun_pump(p, 100);
    if (p->out_fd < 0 && p->err_fd < 0 && waitpid(p->pid, &status, WNOHANG) == p->pid)
      break;
    if (tc__now() > deadline) {
      kill(p->pid, SIGKILL);
      waitpid(p->pid, &status, 0);
      tc_test_fail(__FILE__, __LINE__, "tcrun did not finish within %.0f s; "
                   "stdout: \"%s\" stderr: \"%s\"", TCRUN_DEADLINE, p->out, p->err);
    }
  }
  p->secs = tc__now() - p->t0;
  p->code = WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
}

/* Runs tcrun with args (stdin closed at once) to completion. */
static void tcrun_run(tcrun_proc_t *p, const char *const *args) {
  tcrun_start(p, args);
  tcrun_finish(p);
}

/* Frees the captured output. */
static void tcrun_free(tcrun_proc_t *p) {
  free(p->out);
  free(p->err);
}

/* Compares C strings through pointers, for qsort. */
static int tcrun_cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The lines of text sorted, each ending in '\n' (a malloc()ed string). The
 * ranks' output arrives in any order; per rank it is checked separately. */
static char *tcrun_sorted(const char *text) {
  char *copy = strdup(text), *lines[4096], *save = NULL;
  size_t n = 0, total = 1;
  for (char *l = strtok_r(copy, "\n", &save); l && n < 4096;
       l = strtok_r(NULL, "\n", &save)) {
    lines[n++] = l;
    total += strlen(l) + 1;
  }
  qsort(lines, n, sizeof lines[0], tcrun_cmp_str);
  char *out = malloc(total);
  out[0] = '\0';
  for (size_t k = 0; k < n; k++) {
    strcat(out, lines[k]);
    strcat(out, "\n");
  }
  free(copy);
  return out;
}

/* Asserts the run's code and that stdout (sorted by line) equals want. */
#define TCRUN_ASSERT_SORTED(text, want)                                        \
  do {                                                                         \
    char *tc_s_ = tcrun_sorted(text);                                          \
    TC_ASSERT_STR_EQ(tc_s_, want);                                             \
    free(tc_s_);                                                               \
  } while (0)

TC_TEST(tcrun_sets_torchrun_env_per_rank) {
  setenv("RANK", "99", 1); /* stale values must be replaced */
  setenv("WORLD_SIZE", "77", 1);
  unsetenv("OMP_NUM_THREADS");
  tcrun_proc_t p;
  tcrun_run(&p, (const char *[]){"-n", "3", "--", "sh", "-c",
      "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK "
      "$GROUP_WORLD_SIZE $ROLE_RANK $ROLE_WORLD_SIZE $ROLE_NAME $MASTER_ADDR "
      "$TORCHELASTIC_USE_AGENT_STORE $TORCHELASTIC_RESTART_COUNT "
      "$TORCHELASTIC_MAX_RESTARTS $OMP_NUM_THREADS\"", NULL});
  TC_ASSERT_EQ(p.code, 0);
  TC_ASSERT_STR_EQ(p.err, "");
  TCRUN_ASSERT_SORTED(p.out,
      "0 3 0 3 0 1 0 3 default 127.0.0.1 True 0 0 1\n"
      "1 3 1 3 0 1 1 3 default 127.0.0.1 True 0 0 1\n"
      "2 3 2 3 0 1 2 3 default 127.0.0.1 True 0 0 1\n");
  tcrun_free(&p);

  /* MASTER_PORT and the run id: one value, shared by every rank */
  tcrun_run(&p, (const char *[]){"-n4", "sh", "-c",
      "echo \"$MASTER_PORT $TORCHELASTIC_RUN_ID\"", NULL});
  TC_ASSERT_EQ(p.code, 0);
  int port = 0;
  char runid[64] = "";
  TC_ASSERT_EQ(sscanf(p.out, "%d %63s", &port, runid), 2);
  TC_ASSERT(port > 0 && port < 65536);
  char line[128], want[600] = "";
  snprintf(line, sizeof line, "%d %s\n", port, runid);
  for (int r = 0; r < 4; r++) strcat(want, line);
  TC_ASSERT_STR_EQ(p.out, want);
  TC_ASSERT_CONTAINS(runid, "tcrun-");
  tcrun_free(&p);

  /* a user's OMP_NUM_THREADS is kept; one rank gets none */
  setenv("OMP_NUM_THREADS", "4", 1);
  tcrun_run(&p, (const char *[]){"--nproc-per-node=2", "sh", "-c",
      "echo \"omp=$OMP_NUM_THREADS\"", NULL});
  TC_ASSERT_STR_EQ(p.out, "omp=4\nomp=4\n");
  tcrun_free(&p);
  unsetenv("OMP_NUM_THREADS");
  tcrun_run(&p, (const char *[]){"-np", "1", "sh", "-c",
      "echo \"omp=${OMP_NUM_THREADS-unset}\"", NULL});
  TC_ASSERT_STR_EQ(p.out, "omp=unset\n");
  TC_ASSERT_EQ(p.code, 0);
  tcrun_free(&p);
}

TC_TEST(tcrun_store_listens_and_rank0_gets_stdin) {
  /* pick a free port, then ask tcrun for it */
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof a;
  TC_ASSERT(bind(s, (struct sockaddr *)&a, sizeof a) == 0);
  TC_ASSERT(getsockname(s, (struct sockaddr *)&a, &alen) == 0);
  int port = ntohs(a.sin_port);
  close(s);
  char portarg[32], want[256];
  snprintf(portarg, sizeof portarg, "--port=%d", port);
  tcrun_proc_t p;
  tcrun_start(&p, (const char *[]){"-n", "2", portarg, "sh", "-c",
      "echo \"port $MASTER_PORT\"; read x; echo \"got$RANK [$x]\"", NULL});
  tcrun_wait_for(&p, "got1 []", 1); /* rank 1 reads /dev/null */
  /* the store is up while the ranks run */
  s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TC_ASSERT(connect(s, (struct sockaddr *)&a, sizeof a) == 0);
  close(s);
  TC_ASSERT_EQ(write(p.in_fd, "hello\n", 6), 6); /* only rank 0 sees it */
  tcrun_finish(&p);
  TC_ASSERT_EQ(p.code, 0);
  snprintf(want, sizeof want, "got0 [hello]\ngot1 []\nport %d\nport %d\n",
           port, port);
  TCRUN_ASSERT_SORTED(p.out, want);
  tcrun_free(&p);
}

TC_TEST(tcrun_tag_output_prefixes_whole_lines) {
  tcrun_proc_t p;
  tcrun_run(&p, (const char *[]){"-n", "2", "--tag-output", "--", "sh", "-c",
      "echo out$RANK; echo err$RANK >&2; printf tail$RANK", NULL});
  TC_ASSERT_EQ(p.code, 0);
  TCRUN_ASSERT_SORTED(p.out, "[0]: out0\n[0]: tail0\n[1]: out1\n[1]: tail1\n");
  TCRUN_ASSERT_SORTED(p.err, "[0]: err0\n[1]: err1\n");
  TC_ASSERT(strstr(p.out, "[0]: out0") < strstr(p.out, "[0]: tail0"));
  TC_ASSERT(strstr(p.out, "[1]: out1") < strstr(p.out, "[1]: tail1"));
  tcrun_free(&p);

  /* lines written in pieces by 4 ranks at once never mix */
  tcrun_run(&p, (const char *[]){"-n", "4", "--tag-output", "sh", "-c",
      "i=0; while [ $i -lt 300 ]; do printf a$RANK; printf \"b$RANK\\n\"; "
      "printf c$RANK >&2; printf \"d$RANK\\n\" >&2; i=$((i+1)); done", NULL});
  TC_ASSERT_EQ(p.code, 0);
  int counts[4] = {0};
  char *save = NULL;
  for (char *l = strtok_r(p.out, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
    int r = l[1] - '0';
    char want[32];
    TC_ASSERT(r >= 0 && r < 4);
    snprintf(want, sizeof want, "[%d]: a%db%d", r, r, r);
    TC_ASSERT_STR_EQ(l, want);
    counts[r]++;
  }
  for (int r = 0; r < 4; r++) TC_ASSERT_EQ(counts[r], 300);
  TC_ASSERT_EQ(tcrun_count(p.err, "\n"), 1200);
  TC_ASSERT_EQ(tcrun_count(p.err, "[3]: c3d3\n"), 300);
  tcrun_free(&p);

  /* a very long line is broken into prefixed pieces, nothing lost */
  tcrun_run(&p, (const char *[]){"-n", "1", "--tag-output", "sh", "-c",
      "head -c 200000 /dev/zero | tr '\\000' x", NULL});
  TC_ASSERT_EQ(p.code, 0);
  TC_ASSERT_EQ(tcrun_count(p.out, "x"), 200000);
  TC_ASSERT(tcrun_count(p.out, "[0]: ") >= 3);
  TC_ASSERT_EQ(tcrun_count(p.out, "\n"), tcrun_count(p.out, "[0]: "));
  TC_ASSERT(strncmp(p.out, "[0]: x", 6) == 0);
  tcrun_free(&p);
}

TC_TEST(tcrun_all_ranks_succeed) {
  tcrun_proc_t p;
  tcrun_run(&p, (const char *[]){"-n", "4", "true", NULL});
  TC_ASSERT_EQ(p.code, 0);
  TC_ASSERT_STR_EQ(p.out, "");
  TC_ASSERT_STR_EQ(p.err, "");
  tcrun_free(&p);
  /* one rank finishing early does not stop the others */
  tcrun_run(&p, (const char *[]){"-n", "3", "sh", "-c",
      "if [ $RANK = 0 ]; then exit 0; fi; echo done$RANK", NULL});
  TC_ASSERT_EQ(p.code, 0);
  TCRUN_ASSERT_SORTED(p.out, "done1\ndone2\n");
  TC_ASSERT_STR_EQ(p.err, "");
  tcrun_free(&p);
}

TC_TEST(tcrun_failing_rank_stops_the_others) {
  tcrun_proc_t p;
  tcrun_run(&p, (const char *[]){"-n", "4", "--grace", "5", "--", "sh", "-c",
      "if [ \"$RANK\" = 2 ]; then exit 3; fi; sleep 1000; echo never", NULL});
  TC_ASSERT_EQ(p.code, 3);
  TC_ASSERT_CONTAINS(p.err, "tcrun: rank 2 (pid ");
  TC_ASSERT_CONTAINS(p.err, ") exited with code 3\n");
  TC_ASSERT_CONTAINS(p.err, "stopping the other 3 ranks");
  TC_ASSERT(!strstr(p.err, "did not stop")); /* SIGTERM was enough */
  TC_ASSERT_EQ(tcrun_count(p.err, "tcrun: rank"), 1); /* only the culprit */
  TC_ASSERT_STR_EQ(p.out, "");
  TC_ASSERT(p.secs < 5.0); /* they stopped on SIGTERM, before the grace */
  tcrun_free(&p);
}

TC_TEST(tcrun_sigkill_after_grace) {
  /* rank 1 ignores SIGTERM (and so does its sleep); rank 0 fails once rank
   * 1 is ready: rank 1 must be SIGKILLed after --grace */
  tcrun_proc_t p;
  tcrun_start(&p, (const char *[]){"-n", "2", "--grace", "1", "sh", "-c",
      "trap '' TERM; if [ $RANK = 0 ]; then read x; exit 5; fi; "
      "echo ready; sleep 1000", NULL});
  tcrun_wait_for(&p, "ready", 1);
  double t0 = tc__now();
  TC_ASSERT_EQ(write(p.in_fd, "go\n", 3), 3);
  tcrun_finish(&p);
  double dt = tc__now() - t0;
  TC_ASSERT_EQ(p.code, 5);
  TC_ASSERT_CONTAINS(p.err, "tcrun: rank 0 (pid ");
  TC_ASSERT_CONTAINS(p.err, "exited with code 5");
  TC_ASSERT_CONTAINS(p.err, "tcrun: rank 1 (pid ");
  TC_ASSERT_CONTAINS(p.err, "did not stop within 1 s; sending SIGKILL");
  TC_ASSERT(dt >= 0.9);  /* the grace period was honoured */
  TC_ASSERT(dt < 20.0);  /* and then it ended */
  tcrun_free(&p);
}

TC_TEST(tcrun_kills_what_a_failed_rank_left_behind) {
  /* the rank starts a background process that ignores SIGTERM, then
   * fails: tcrun must SIGKILL it after --grace, not wait for it forever */
  tcrun_proc_t p;
  tcrun_start(&p, (const char *[]){"-n", "1", "--grace", "1", "sh", "-c",
      "sh -c 'trap \"\" TERM; echo \"bg $$\"; exec sleep 1000' & "
      "read x; exit 4", NULL});
  tcrun_wait_for(&p, "bg ", 1);
  int bg = atoi(strstr(p.out, "bg ") + 3);
  TC_ASSERT(bg > 0);
  double t0 = tc__now();
  TC_ASSERT_EQ(write(p.in_fd, "go\n", 3), 3);
  tcrun_finish(&p);
  double dt = tc__now() - t0;
  TC_ASSERT_EQ(p.code, 4);
  TC_ASSERT_CONTAINS(p.err, "exited with code 4");
  TC_ASSERT_CONTAINS(p.err, "processes left behind by the ranks did not stop "
                            "within 1 s; sending SIGKILL");
  TC_ASSERT(dt >= 0.9 && dt < 20.0);
  /* it is gone (reaped by tcrun, or by init once tcrun is gone) */
  double deadline = tc__now() + 10;
  while (kill(bg, 0) == 0 && tc__now() < deadline) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  TC_ASSERT(kill(bg, 0) < 0 && errno == ESRCH);
  tcrun_free(&p);
}

TC_TEST(tcrun_rank_killed_by_signal) {
  tcrun_proc_t p;
  tcrun_run(&p, (const char *[]){"-n", "3", "sh", "-c",
      "if [ $RANK = 1 ]; then kill -9 $$; fi; sleep 1000", NULL});
  TC_ASSERT_EQ(p.code, 128 + 9);
  TC_ASSERT_CONTAINS(p.err, "tcrun: rank 1 (pid ");
  TC_ASSERT_CONTAINS(p.err, ") was killed by signal 9 (SIGKILL)\n");
  TC_ASSERT(p.secs < 20.0);
  tcrun_free(&p);
}

TC_TEST(tcrun_missing_program) {
  tcrun_proc_t p;
  tcrun_run(&p, (const char *[]){"-n", "2", "tc-no-such-program-xyz", NULL});
  TC_ASSERT_EQ(p.code, 127);
  TC_ASSERT_STR_EQ(p.err, "tcrun: cannot run 'tc-no-such-program-xyz': No "
                          "such file or directory\n");
  TC_ASSERT_STR_EQ(p.out, "");
  tcrun_free(&p);
  tcrun_run(&p, (const char *[]){"-n", "1", "--tag-output", "/nonexistent/x", NULL});
  TC_ASSERT_EQ(p.code, 127);
  TC_ASSERT_STR_EQ(p.err, "tcrun: cannot run '/nonexistent/x': No such file "
                          "or directory\n");
  tcrun_free(&p);
  tcrun_run(&p, (const char *[]){"-n", "1", "/", NULL}); /* not executable */
  TC_ASSERT_EQ(p.code, 126);
  TC_ASSERT_STR_EQ(p.err, "tcrun: cannot run '/': Permission denied\n");
  tcrun_free(&p);
}

TC_TEST(tcrun_timeout) {
  tcrun_proc_t p;
  tcrun_run(&p, (const char *[]){"-n", "2", "--timeout", "1", "--grace", "1",
                                 "--", "sleep", "1000", NULL});
  TC_ASSERT_EQ(p.code, 124);
  TC_ASSERT_CONTAINS(p.err, "tcrun: --timeout of 1 s expired with 2 ranks "
                            "still running; stopping them\n");
  TC_ASSERT(p.secs >= 0.9);
  TC_ASSERT(p.secs < 20.0);
  tcrun_free(&p);
}

TC_TEST(tcrun_forwards_signals) {
  tcrun_proc_t p;
  tcrun_start(&p, (const char *[]){"-n", "2", "sh", "-c",
      "trap 'echo term$RANK; exit 0' TERM; sleep 1000 & echo ready; wait",
      NULL});
  tcrun_wait_for(&p, "ready", 2);
  kill(p.pid, SIGTERM);
  tcrun_finish(&p);
  TC_ASSERT_EQ(p.code, 128 + SIGTERM);
  TCRUN_ASSERT_SORTED(p.out, "ready\nready\nterm0\nterm1\n");
  /* (if SIGTERM hit a sleep before its exec, it is SIGKILLed after 3 s) */
  TC_ASSERT(strncmp(p.err, "tcrun: received SIGTERM; forwarding it to 2 "
                           "ranks\n", 50) == 0);
  TC_ASSERT(p.secs < 20.0);
  tcrun_free(&p);

  tcrun_start(&p, (const char *[]){"-n", "2", "--tag-output", "sh", "-c",
      "echo ready; exec sleep 1000", NULL});
  tcrun_wait_for(&p, "ready", 2);
  kill(p.pid, SIGINT);
  tcrun_finish(&p);
  TC_ASSERT_EQ(p.code, 128 + SIGINT);
  TC_ASSERT_STR_EQ(p.err, "tcrun: received SIGINT; forwarding it to 2 ranks\n");
  tcrun_free(&p);
}

TC_TEST(tcrun_removes_segments_of_ranks_killed_in_creation) {
  /* every rank dies during creation: killed as soon as its shared-memory
   * segment exists (tc_die_in_create), or by tcrun's SIGTERM once the first
   * one died; the ranks do not sweep (TORCHCOMMS_SHM_SWEEP=0), so only tcrun
   * can remove what they leave */
  setenv("TORCHCOMMS_SHM_SWEEP", "0", 1);
  setenv("TORCHCOMMS_CPU_TRANSPORT", "shm", 1);
  setenv("TORCHCOMMS_LOG", "info", 1);
  tcrun_proc_t p;
  tcrun_run(&p, (const char *[]){"-n", "4", TC_BUILD_DIR "/tc_die_in_create", "segment",
                                 NULL});
  TC_ASSERT_EQ(p.code, 128 + 9);
  if (tcrun_count(p.out, "segment\n") < 1) /* it left one at least */
    tc_test_fail(__FILE__, __LINE__, "no rank got to create its segment:\n%s%s", p.out, p.err);
  TC_ASSERT_CONTAINS(p.err, "tcrun: removed ");
  long pids[4];
  int n = 0;
  for (char *s = p.out; n < 4 && (s = strstr(s, "pid ")) != NULL; s += 4) pids[n++] = atol(s + 4);
  TC_ASSERT_EQ(n, 4);
  DIR *d = opendir("/dev/shm");
  TC_ASSERT(d != NULL);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    tc_shm_owner_t o;
    if (tc__shm_name_owner(e->d_name, &o) != 0) continue;
    for (int r = 0; r < 4; r++)
      if (o.pid == pids[r])
        tc_test_fail(__FILE__, __LINE__, "tcrun left /dev/shm/%s of rank %d (pid %ld)",
                     e->d_name, r, pids[r]);
  }
  closedir(d);
  tcrun_free(&p);
}

/* This process's Cpus_allowed_list (what a rank left unbound inherits). */
static void tcrun_own_cpus(char *out, size_t len) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[4096];
  out[0] = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "Cpus_allowed_list: %1023s", out) == 1) break;
  if (f) fclose(f);
  (void)len;
}

/* "RANK CPUS\n" of every rank, sorted, for the rank count and --bind-to. */
static char *tcrun_affinities(int n, const char *bind) {
  char nb[16];
  snprintf(nb, sizeof nb, "%d", n);
  tcrun_proc_t p;
  tcrun_run(&p, (const char *[]){"-n", nb, "--bind-to", bind, "sh", "-c",
      "echo \"$RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2)\"", NULL});
  TC_ASSERT_EQ(p.code, 0);
  char *s = tcrun_sorted(p.out);
  tcrun_free(&p);
  return s;
}

TC_TEST(tcrun_binds_ranks_to_cores) {
  cpu_set_t set;
  TC_ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  int cpus[CPU_SETSIZE], ncpu = 0;
  for (int k = 0; k < CPU_SETSIZE; k++)
    if (CPU_ISSET(k, &set)) cpus[ncpu++] = k;
  char own[1024], want[8192], line[1100];
  tcrun_own_cpus(own, sizeof own);
  TC_ASSERT(own[0]);
  /* ranks sort as text below: up to 9 (rank 9 would sort before 2) */
  const int many = ncpu + 1 <= 9 ? ncpu + 1 : 9;
  static const struct {
    int n; /* 0: `many` */
    const char *bind;
  } cases[] = {{2, "auto"}, {0, "auto"}, {2, "none"}, {0, "core"}, {1, "auto"}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int n = cases[c].n ? cases[c].n : many;
    const char *b = cases[c].bind;
    /* auto: round-robin from 2 ranks (one core each up to ncpu); core:
     * round-robin, always */
    int bound = !strcmp(b, "core") || (!strcmp(b, "auto") && n >= 2);
    want[0] = 0;
    for (int r = 0; r < n; r++) {
      if (bound) snprintf(line, sizeof line, "%d %d\n", r, cpus[r % ncpu]);
      else snprintf(line, sizeof line, "%d %s\n", r, own);
      strcat(want, line);
    }
    char *got = tcrun_affinities(n, b);
    TC_ASSERT_STR_EQ(got, want);
    free(got);
  }
}

TC_TEST(tcrun_help_and_bad_usage) {
  tcrun_proc_t p;
  const char *helps[] = {"--help", "-h"};
  for (int k = 0; k < 2; k++) {
    tcrun_run(&p, (const char *[]){helps[k], NULL});
    TC_ASSERT_EQ(p.code, 0);
    TC_ASSERT(strncmp(p.out, "usage: tcrun -n N", 17) == 0);
    TC_ASSERT_CONTAINS(p.out, "--tag-output");
    TC_ASSERT_STR_EQ(p.err, "");
    tcrun_free(&p);
  }
  static const struct {
    const char *args[12];
    const char *msg;
  } bad[] = {
      {{NULL}, "-n N (the number of ranks) is required"},
      {{"true", NULL}, "-n N (the number of ranks) is required"},
      {{"-n", "2", NULL}, "no program given"},
      {{"-n", "2", "--", NULL}, "no program given"},
      {{"-n", NULL}, "option '-n' needs a value"},
      {{"-n", "0", "true", NULL}, "bad value for -n: '0'"},
      {{"-n", "x", "true", NULL}, "bad value for -n: 'x'"},
      {{"-n", "2x", "true", NULL}, "bad value for -n: '2x'"},
      {{"-n", "2", "--bogus", "true", NULL}, "unknown option '--bogus'"},
      {{"-n", "2", "--grace", "-1", "true", NULL}, "bad value for --grace"},
      {{"-n", "2", "--timeout", "abc", "true", NULL}, "bad value for --timeout"},
      {{"-n", "2", "--port", "70000", "true", NULL}, "bad value for --port"},
      {{"-n", "2", "--bind-to", "socket", "true", NULL}, "bad value for --bind-to: 'socket'"},
      {{"-n", "2", "--nnodes", "0", "true", NULL}, "bad value for --nnodes: '0'"},
      {{"-n", "2", "--nnodes", "x", "true", NULL}, "bad value for --nnodes: 'x'"},
      {{"-n", "2", "--node-rank", "-1", "true", NULL}, "bad value for --node-rank: '-1'"},
      {{"-n", "2", "--node-rank", "1", "true", NULL},
       "bad value for --node-rank: '1' (expected 0 to 0: --nnodes is 1)"},
      {{"-n", "2", "--nnodes", "2", "--node-rank", "2", "true", NULL},
       "bad value for --node-rank: '2' (expected 0 to 1: --nnodes is 2)"},
      {{"-n", "2", "--nnodes", "2", "--master-addr", "127.0.0.1", "--port", "29500", "true", NULL},
       "--nnodes 2 needs --node-rank K (this host's node, 0 to 1)"},
      {{"-n", "2", "--nnodes=2", "--node-rank=1", "--port=29500", "true", NULL},
       "--nnodes 2 needs --master-addr ADDR (node 0's address, where it hosts the store)"},
      {{"-n", "2", "--nnodes=2", "--node-rank=1", "--master-addr=h", "true", NULL},
       "--nnodes 2 needs --port PORT (a fixed port: the other nodes must know it)"},
      {{"-n", "2", "--nnodes=2", "--node-rank=1", "--master-addr=h", "--port=0", "true", NULL},
       "--nnodes 2 needs --port PORT (a fixed port: the other nodes must know it)"},
      {{"-n", "2", "--master-addr=", "true", NULL}, "bad value for --master-addr: ''"},
      {{"-n", "2", "--join-timeout", "-3", "true", NULL}, "bad value for --join-timeout: '-3'"},
      {{"-n", "2", "--nnodes", NULL}, "option '--nnodes' needs a value"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    tcrun_run(&p, bad[k].args);
    TC_ASSERT_EQ(p.code, 2);
    TC_ASSERT_STR_EQ(p.out, "");
    TC_ASSERT_CONTAINS(p.err, bad[k].msg);
    TC_ASSERT_CONTAINS(p.err, "usage: tcrun");
    tcrun_free(&p);
  }
}

#define TCRUN_ENV_LINE                                                         \
  "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK "        \
  "$GROUP_WORLD_SIZE $ROLE_RANK $ROLE_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "   \
  "$TORCHELASTIC_RUN_ID\""

/* Two tcruns on this host as nodes 0 and 1 of one job (node 1 connecting to
 * node 0's store over loopback): each rank's torchrun variables, exactly;
 * with nproc (node 0, node 1) ranks per node. Node 1 is started first: it
 * waits for node 0's store. */
static void tcrun_two_nodes(int n0, int n1) {
  int port = tc_free_port();
  char portarg[32], n0arg[16], n1arg[16];
  snprintf(portarg, sizeof portarg, "--port=%d", port);
  snprintf(n0arg, sizeof n0arg, "-n%d", n0);
  snprintf(n1arg, sizeof n1arg, "-n%d", n1);
  tcrun_proc_t p0, p1;
  tcrun_start(&p1, (const char *[]){"--nnodes", "2", "--node-rank", "1", "--master-addr",
      "127.0.0.1", portarg, n1arg, "sh", "-c", TCRUN_ENV_LINE, NULL});
  tcrun_start(&p0, (const char *[]){"--nnodes=2", "--node-rank=0", "--master-addr=127.0.0.1",
      portarg, n0arg, "--", "sh", "-c", TCRUN_ENV_LINE, NULL});
  tcrun_finish(&p1);
  tcrun_finish(&p0);
  TC_ASSERT_EQ(p0.code, 0);
  TC_ASSERT_EQ(p1.code, 0);
  TC_ASSERT_STR_EQ(p0.err, "");
  TC_ASSERT_STR_EQ(p1.err, "");
  /* one run id for the whole job: node 0's */
  char runid[64] = "";
  const char *at = strstr(p0.out, "tcrun-");
  TC_ASSERT(at != NULL);
  TC_ASSERT_EQ(sscanf(at, "%63s", runid), 1);
  char want0[1024] = "", want1[1024] = "", line[256];
  int world = n0 + n1;
  for (int r = 0; r < n0; r++) {
    snprintf(line, sizeof line, "%d %d %d %d 0 2 %d %d 127.0.0.1 %d %s\n", r, world, r, n0,
             r, world, port, runid);
    strcat(want0, line);
  }
  for (int r = 0; r < n1; r++) {
    snprintf(line, sizeof line, "%d %d %d %d 1 2 %d %d 127.0.0.1 %d %s\n", n0 + r, world, r,
             n1, n0 + r, world, port, runid);
    strcat(want1, line);
  }
  char *sorted0 = tcrun_sorted(want0), *sorted1 = tcrun_sorted(want1);
  TCRUN_ASSERT_SORTED(p0.out, sorted0);
  TCRUN_ASSERT_SORTED(p1.out, sorted1);
  free(sorted0);
  free(sorted1);
  tcrun_free(&p0);
  tcrun_free(&p1);
}

TC_TEST(tcrun_two_nodes_on_loopback) {
  tcrun_two_nodes(2, 2); /* RANK = node * 2 + local rank */
  tcrun_two_nodes(1, 3); /* uneven: node 1's ranks follow node 0's */
}

/* A C program's ranks of both nodes form one communicator through node 0's
 * store: the quick start's all_reduce of rank + 1 over 2 + 1 ranks. */
TC_TEST(tcrun_two_nodes_one_communicator) {
  int port = tc_free_port();
  char portarg[32];
  snprintf(portarg, sizeof portarg, "--port=%d", port);
  tcrun_proc_t p0, p1;
  tcrun_start(&p0, (const char *[]){"--nnodes=2", "--node-rank=0", "--master-addr=127.0.0.1",
      portarg, "-n2", "--tag-output", TC_BUILD_DIR "/examples/all_reduce_sync", NULL});
  tcrun_start(&p1, (const char *[]){"--nnodes=2", "--node-rank=1", "--master-addr=127.0.0.1",
      portarg, "-n1", "--tag-output", TC_BUILD_DIR "/examples/all_reduce_sync", NULL});
  tcrun_finish(&p0);
  tcrun_finish(&p1);
  TC_ASSERT_EQ(p0.code, 0);
  TC_ASSERT_EQ(p1.code, 0);
  TC_ASSERT_CONTAINS(p0.out, "[0]: Rank 0: After AllReduce: 6.0\n");
  TC_ASSERT_CONTAINS(p0.out, "[1]: Rank 1: After AllReduce: 6.0\n");
  TC_ASSERT_CONTAINS(p1.out, "[2]: Rank 2: After AllReduce: 6.0\n");
  tcrun_free(&p0);
  tcrun_free(&p1);
}

/* Node 1 takes node 0's run id whole, also when it is shorter than node
 * 1's own ("tcrun-<pid>"): the test stands in for node 0 with a store of
 * its own holding what node 0 publishes. */
TC_TEST(tcrun_node_takes_a_shorter_run_id_whole) {
  tc_store_server_t *server = NULL;
  TC_ASSERT_OK(tc_store_server_start("127.0.0.1", 0, &server));
  int port = tc_store_server_port(server);
  tc_store_t *st = NULL;
  TC_ASSERT_OK(tc_store_tcp_connect("127.0.0.1", port, 10.0, &st));
  int64_t claims = 0;
  TC_ASSERT_OK(tc_store_add(st, "tcrun/claim/0", 1, &claims));
  TC_ASSERT_OK(tc_store_set(st, "tcrun/run_id", "r1", 2));
  TC_ASSERT_OK(tc_store_set(st, "tcrun/node/0", "1 2", 3));
  char portarg[32];
  snprintf(portarg, sizeof portarg, "--port=%d", port);
  tcrun_proc_t p;
  tcrun_run(&p, (const char *[]){"--nnodes=2", "--node-rank=1", "--master-addr=127.0.0.1",
      portarg, "-n1", "sh", "-c", TCRUN_ENV_LINE, NULL});
  TC_ASSERT_EQ(p.code, 0);
  char want[256];
  snprintf(want, sizeof want, "1 2 0 1 1 2 1 2 127.0.0.1 %d r1\n", port);
  TC_ASSERT_STR_EQ(p.out, want);
  tcrun_free(&p);
  tc_store_release(st);
  tc_store_server_stop(server);
}

/* Joining fails with a clear message and status 1: node 0's store never
 * comes (join timeout), or two tcruns claim the same node rank. */
TC_TEST(tcrun_two_nodes_join_failures) {
  int port = tc_free_port();
  char portarg[32];
  snprintf(portarg, sizeof portarg, "--port=%d", port);
  tcrun_proc_t p;
  tcrun_run(&p, (const char *[]){"--nnodes=2", "--node-rank=1", "--master-addr=127.0.0.1",
      portarg, "--join-timeout=1", "-n1", "true", NULL});
  TC_ASSERT_EQ(p.code, 1);
  TC_ASSERT_CONTAINS(p.err, "tcrun: node 1 cannot reach node 0's store at 127.0.0.1:");
  TC_ASSERT_CONTAINS(p.err, "within --join-timeout 1 s");
  tcrun_free(&p);

  /* node 0 alone: waits for node 1, which never joins */
  tcrun_run(&p, (const char *[]){"--nnodes=2", "--node-rank=0", "--master-addr=127.0.0.1",
      portarg, "--join-timeout=1", "-n1", "true", NULL});
  TC_ASSERT_EQ(p.code, 1);
  TC_ASSERT_STR_EQ(p.err, "tcrun: timed out after --join-timeout 1 s waiting for all 2 "
                          "nodes to join\n");
  tcrun_free(&p);

  /* two node 1s: the second one is refused; node 0 and the first run on */
  tcrun_proc_t p0, p1, dup;
  tcrun_start(&p1, (const char *[]){"--nnodes=2", "--node-rank=1", "--master-addr=127.0.0.1",
      portarg, "-n1", "true", NULL});
  tcrun_start(&p0, (const char *[]){"--nnodes=2", "--node-rank=0", "--master-addr=127.0.0.1",
      portarg, "-n1", "sh", "-c", "echo up; read x; true", NULL});
  tcrun_wait_for(&p0, "up", 1); /* node 0 started its rank: node 1 joined */
  tcrun_run(&dup, (const char *[]){"--nnodes=2", "--node-rank=1", "--master-addr=127.0.0.1",
      portarg, "-n1", "true", NULL});
  TC_ASSERT_EQ(dup.code, 1);
  TC_ASSERT_CONTAINS(dup.err, "tcrun: node rank 1 is already taken: another tcrun joined "
                              "this job");
  tcrun_finish(&p0); /* closes the rank's stdin */
  tcrun_finish(&p1);
  TC_ASSERT_STR_EQ(p0.err, "");
  TC_ASSERT_EQ(p0.code, 0);
  TC_ASSERT_EQ(p1.code, 0);
  tcrun_free(&p0);
  tcrun_free(&p1);
  tcrun_free(&dup);
}
