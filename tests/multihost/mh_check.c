/* mh_check.c -- one rank of the multi-host correctness job (tests/multihost/
 * bed.sh test). Started by `tcrun --nnodes H` on each emulated host (its own
 * network and UTS namespace, so its own hostname), it takes its rank from
 * torchrun's variables and checks, on backend "cpu":
 *
 *  1. the layout: every rank's hostname, GROUP_RANK and LOCAL_WORLD_SIZE
 *     (all_gather): ranks of one node share a hostname, nodes differ, and
 *     each node's ranks are contiguous (tcrun numbers them node by node);
 *  2. topology detection: the communicator logs "<L> ranks on this machine"
 *     with L = this host's rank count (TORCHCOMMS_LOG=debug, subsystem init,
 *     into a private log file read back here), so the backend sees H hosts
 *     (the line of the busy-poll policy: TORCHCOMMS_CPU_SPIN_US is unset);
 *  3. every operation of tests/c/test_collectives.c (the same case functions,
 *     compiled in from that file) at counts 0, 1, 7 with every dtype and
 *     every allowed reduction, and at MH_MID_COUNT elements (above every
 *     size threshold of the TCP algorithms: ring, pipelined all_to_all) with
 *     the subset test_collectives.c uses for its large count, and at
 *     TC_BIG_COUNT (1 Mi + 3) the bandwidth-bound ones on float32 (sum, max);
 *     each result compared exactly with a reference computed locally;
 *  4. split: one communicator per host (all its ranks on one machine: shared
 *     memory), one of the first rank of every host (one rank per machine),
 *     and even / odd ranks (across hosts); each checks its own local count
 *     in the log and runs all_reduce, all_gather, reduce_scatter, broadcast,
 *     send/recv and a batch at counts 7 and MH_MID_COUNT.
 *
 * Prints one line "mh_check: rank R ... OK" and exits 0; the first mismatch
 * prints "FAIL" with the case (tc_test_fail) and exits 1. */
#define main tc_mh_runner_main_unused /* the runner's main is not ours */
#include "../c/runner.c"
#undef main
#include "../c/test_collectives.c"

#include <unistd.h>

#define MH_MID_COUNT ((size_t)70001) /* x 1 B > 64 KiB; x 4 B x 4 ranks > 1 MiB */
#define MH_HOST_LEN 64

static int mh_env_int(const char *name) {
  const char *v = getenv(name);
  if (!v || !*v) tc_test_fail(__FILE__, __LINE__, "%s is not set: run under tcrun", name);
  return atoi(v);
}

static char mh_log_path[128];

/* Fails unless this process's log holds the line of communicator `name`,
 * rank `rank`: "<local> ranks on this machine". */
static void mh_check_local(const char *name, int rank, int local) {
  static char text[1 << 20];
  FILE *f = fopen(mh_log_path, "r");
  if (!f) tc_test_fail(__FILE__, __LINE__, "cannot read the log %s", mh_log_path);
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  char want[256], prefix[200];
  snprintf(prefix, sizeof prefix, "cpu backend '%s' rank %d: ", name, rank);
  snprintf(want, sizeof want, "%s%d ranks on this machine,", prefix, local);
  if (!strstr(text, want)) {
    const char *got = strstr(text, prefix);
    char line[256] = "(none)";
    if (got) snprintf(line, sizeof line, "%.*s", (int)strcspn(got, "\n"), got);
    tc_test_fail(__FILE__, __LINE__, "topology: communicator '%s' rank %d should see %d "
                 "ranks on its machine; its log line: %s (log kept: %s)", name, rank, local,
                 line, mh_log_path);
  }
}

/* Fails unless the log says whether communicator `name`, rank `rank`,
 * chose the hierarchy (want: "hierarchical: H hosts, L local ranks, leader
 * rank X"), or, want NULL, that it did not. */
static void mh_check_hier(const char *name, int rank, const char *want) {
  static char text[1 << 20];
  FILE *f = fopen(mh_log_path, "r");
  if (!f) tc_test_fail(__FILE__, __LINE__, "cannot read the log %s", mh_log_path);
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  char prefix[200], line[400];
  snprintf(prefix, sizeof prefix, "cpu backend '%s' rank %d: hierarchical: ", name, rank);
  if (want) snprintf(line, sizeof line, "cpu backend '%s' rank %d: %s", name, rank, want);
  if (want ? !strstr(text, line) : strstr(text, prefix) != NULL)
    tc_test_fail(__FILE__, __LINE__, "hierarchy: communicator '%s' rank %d: the log should "
                 "%s \"%s\" (log kept: %s)", name, rank, want ? "hold" : "not hold",
                 want ? line : prefix, mh_log_path);
}

/* Runs the operations of `ops` on c at the given counts: counts up to 7
 * with every dtype and reduction, larger ones with the big-count subset. */
static int mh_run_ops(tc_comm_t *c, const tc_op_desc_t *const *ops, size_t nops,
                      const size_t *counts, size_t ncounts, const char *label) {
  int rank = tc_comm_rank(c), n = tc_comm_size(c), k = 0;
  for (size_t oi = 0; oi < nops; oi++) {
    const tc_op_desc_t *d = ops[oi];
    for (size_t ci = 0; ci < ncounts; ci++)
      for (int dt = 0; dt < TC_DTYPE_COUNT; dt++)
        for (int op = 0; op < (d->reducing ? TC_REDOP_COUNT : 1); op++) {
          if (d->reducing && !tc__redop_allowed((tc_dtype_t)dt, op)) continue;
          if (counts[ci] > 7 && !big_allowed(d, (tc_dtype_t)dt, (tc_redop_type_t)op, 0)) continue;
          tc_redop_t rop = op == TC_PREMUL_SUM ? TC_OP_PREMUL_SUM(0.5)
                                               : TC_OP((tc_redop_type_t)op);
          int async = (k++ % 2) == 1;
          snprintf(tc_case, sizeof tc_case, "%s: %s rank %d of %d dtype %s op %s count %zu %s",
                   label, d->name, rank, n, tc_dtype_name((tc_dtype_t)dt),
                   d->reducing ? tc_redop_name((tc_redop_type_t)op) : "-", counts[ci],
                   async ? "async" : "sync");
          d->fn(c, rank, n, (tc_dtype_t)dt, rop, counts[ci], async);
        }
  }
  return k;
}

static const tc_op_desc_t *const mh_all_ops[] = {
    &desc_all_reduce,        &desc_reduce,          &desc_broadcast,
    &desc_all_gather,        &desc_all_gather_single, &desc_all_gather_v,
    &desc_reduce_scatter,    &desc_reduce_scatter_single, &desc_reduce_scatter_v,
    &desc_all_to_all_single, &desc_all_to_all_v_single, &desc_all_to_all,
    &desc_scatter,           &desc_gather,          &desc_gather_single,
    &desc_send_recv,         &desc_batch,           &desc_barrier};

static const tc_op_desc_t *const mh_split_ops[] = {
    &desc_all_reduce, &desc_all_gather, &desc_reduce_scatter_single,
    &desc_broadcast,  &desc_send_recv,  &desc_batch};

/* Splits c into `ranks` (nranks 0: this rank joins none), checks the new
 * communicator's local count and runs mh_split_ops on it. */
static int mh_split(tc_comm_t *c, const int *ranks, size_t nranks, const char *name,
                    int local) {
  tc_comm_t *s = NULL;
  TC_ASSERT_OK(tc_comm_split(c, ranks, nranks, name, NULL, &s));
  if (nranks == 0) {
    TC_ASSERT(s == NULL);
    return 0;
  }
  TC_ASSERT(s != NULL);
  TC_ASSERT_EQ(tc_comm_size(s), (long long)nranks);
  if (nranks > 1) mh_check_local(name, tc_comm_rank(s), local); /* 1: no transport */
  const size_t counts[] = {7, MH_MID_COUNT};
  int k = mh_run_ops(s, mh_split_ops, sizeof mh_split_ops / sizeof mh_split_ops[0], counts,
                     2, name);
  TC_ASSERT_OK(tc_comm_finalize(s));
  TC_ASSERT_OK(tc_comm_destroy(s));
  return k;
}

int main(void) {
  int rank = mh_env_int("RANK"), size = mh_env_int("WORLD_SIZE");
  int node = mh_env_int("GROUP_RANK"), nnodes = mh_env_int("GROUP_WORLD_SIZE");
  int local = mh_env_int("LOCAL_WORLD_SIZE"), lrank = mh_env_int("LOCAL_RANK");
  double t0 = tc__now();
  snprintf(mh_log_path, sizeof mh_log_path, "/tmp/tcmh-check-%d.log", (int)getpid());
  unlink(mh_log_path);
  /* the line read back is the busy-poll policy's, which a fixed
   * TORCHCOMMS_CPU_SPIN_US skips */
  if (getenv("TORCHCOMMS_CPU_SPIN_US")) {
    if (rank == 0)
      fprintf(stderr, "mh_check: ignoring TORCHCOMMS_CPU_SPIN_US=%s (with it the backend "
              "does not log its local rank count, which this test checks)\n",
              getenv("TORCHCOMMS_CPU_SPIN_US"));
    unsetenv("TORCHCOMMS_CPU_SPIN_US");
  }
  setenv("TORCHCOMMS_LOG", "debug", 1);
  setenv("TORCHCOMMS_LOG_SUBSYS", "init", 1);
  setenv("TORCHCOMMS_LOG_FILE", mh_log_path, 1);

  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.name = "mh";
  o.timeout_s = 120;
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(tc_comm_create("cpu", "cpu", &o, &c));
  TC_ASSERT_EQ(tc_comm_rank(c), rank);
  TC_ASSERT_EQ(tc_comm_size(c), size);

  /* 1. the layout */
  struct {
    char host[MH_HOST_LEN];
    int32_t node, local, lrank;
  } me = {.node = node, .local = local, .lrank = lrank}, *all;
  gethostname(me.host, sizeof me.host - 1);
  all = tc_xmalloc((size_t)size * sizeof *all);
  TC_ASSERT_OK(tc_all_gather_single(c, all, &me, sizeof me, TC_UINT8, NULL, NULL));
  int *first = tc_xmalloc((size_t)nnodes * sizeof *first); /* first rank of each node */
  for (int j = 0; j < nnodes; j++) first[j] = -1;
  for (int r = 0; r < size; r++) {
    TC_ASSERT(all[r].node >= 0 && all[r].node < nnodes);
    if (first[all[r].node] < 0) first[all[r].node] = r;
    int f = first[all[r].node];
    if (r > 0 && all[r].node != all[r - 1].node) TC_ASSERT_EQ(all[r].node, all[r - 1].node + 1);
    TC_ASSERT_EQ(all[r].lrank, r - f); /* contiguous, node by node */
    TC_ASSERT_EQ(all[r].local, all[f].local);
    TC_ASSERT_STR_EQ(all[r].host, all[f].host);
    if (all[r].node > 0) { /* every node its own host name */
      for (int j = 0; j < all[r].node; j++)
        if (!strcmp(all[first[j]].host, all[r].host))
          tc_test_fail(__FILE__, __LINE__, "nodes %d and %d have the same host name '%s': "
                       "not separate hosts (run through tests/multihost/bed.sh)", j,
                       all[r].node, all[r].host);
    }
  }
  for (int j = 0; j < nnodes; j++) TC_ASSERT(first[j] >= 0);

  /* 2. topology detection, and the hierarchy (TORCHCOMMS_CPU_HIER: auto
   * chooses it when a host has 2 or more ranks; 0: flat) */
  mh_check_local("mh", rank, local);
  const char *hier = getenv("TORCHCOMMS_CPU_HIER");
  int hier_off = hier && !strcmp(hier, "0");
  if (!hier_off && size > nnodes) {
    char want[160];
    snprintf(want, sizeof want, "hierarchical: %d hosts, %d local ranks, leader rank %d ",
             nnodes, local, first[node]);
    mh_check_hier("mh", rank, want);
  } else if (hier_off) {
    mh_check_hier("mh", rank, NULL);
  }

  /* 3. every operation */
  const size_t counts[] = {0, 1, 7, MH_MID_COUNT};
  int cases = mh_run_ops(c, mh_all_ops, sizeof mh_all_ops / sizeof mh_all_ops[0], counts, 4,
                         "world");

  /* and multi-megabyte messages (TC_BIG_COUNT) of the bandwidth-bound
   * operations on float32: several chunks of every pipelined algorithm */
  static const tc_op_desc_t *const big_ops[] = {
      &desc_all_reduce, &desc_reduce_scatter_single, &desc_all_gather_single,
      &desc_all_to_all_single, &desc_broadcast};
  for (size_t oi = 0; oi < sizeof big_ops / sizeof big_ops[0]; oi++)
    for (int op = TC_SUM; op <= (big_ops[oi]->reducing ? TC_MAX : TC_SUM); op++) {
      if (op != TC_SUM && op != TC_MAX) continue;
      snprintf(tc_case, sizeof tc_case, "world: %s rank %d of %d dtype float32 op %s count %zu",
               big_ops[oi]->name, rank, size, tc_redop_name((tc_redop_type_t)op), TC_BIG_COUNT);
      big_ops[oi]->fn(c, rank, size, TC_FLOAT32, TC_OP((tc_redop_type_t)op), TC_BIG_COUNT,
                      op == TC_MAX);
      cases++;
    }

  /* 4. splits */
  int *ranks = tc_xmalloc((size_t)size * sizeof *ranks);
  size_t nr = 0;
  for (int r = 0; r < size; r++)
    if (all[r].node == node) ranks[nr++] = r;
  cases += mh_split(c, ranks, nr, "mh_host", local);
  nr = 0;
  for (int j = 0; j < nnodes; j++) ranks[nr++] = first[j];
  cases += mh_split(c, ranks, lrank == 0 ? nr : 0, "mh_leaders", 1);
  nr = 0;
  int here = 0; /* ranks of my parity on my host */
  for (int r = 0; r < size; r++)
    if (r % 2 == rank % 2) {
      ranks[nr++] = r;
      here += all[r].node == node;
    }
  cases += mh_split(c, ranks, nr, rank % 2 ? "mh_odd" : "mh_even", here);

  TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
  unlink(mh_log_path);
  printf("mh_check: rank %d of %d on host %s (node %d of %d, %d ranks on this host): "
         "%d cases OK in %.1f s\n", rank, size, me.host, node, nnodes, local, cases,
         tc__now() - t0);
  fflush(stdout);
  free(all);
  free(first);
  free(ranks);
  return 0;
}
