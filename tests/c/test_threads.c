/* test_threads.c -- several ranks of one communicator as threads of one
 * process (torchft's and torch's threaded tests do that): every thread
 * creates its rank over a store the threads share, runs collectives and
 * point-to-point checked exactly, and finalizes. Over shared memory and
 * TCP; with one TCPStore client shared by every thread (a thread waiting in
 * a get must not keep another from setting the key), a client per thread,
 * an in-process memory store, and the default store (MASTER_ADDR /
 * MASTER_PORT: rank 0's thread hosts the server). The same name created
 * twice in a row, and at the same time as another communicator, must meet
 * each time. */
#include <pthread.h>

#include "coll_util.h" /* tc_xmalloc */
#include "core/core.h" /* the communicator's lock and numbering */

enum { SHARED_CLIENT, CLIENT_PER_THREAD, MEMORY, DEFAULT_STORE };

typedef struct {
  int rank, size, store_kind, port;
  tc_store_t *store; /* shared by the threads (SHARED_CLIENT, MEMORY) */
  const char *name;
} rank_arg_t;

static tc_comm_t *thread_comm(const rank_arg_t *a, const char *name, int rank,
                              tc_store_t *store) {
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.rank = rank;
  o.world_size = a->size;
  o.name = name;
  o.store = store; /* NULL: the default store */
  o.timeout_s = 20.0;
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(tc_comm_create("cpu", "cpu", &o, &c));
  TC_ASSERT_EQ(tc_comm_rank(c), rank);
  return c;
}

static void exercise(tc_comm_t *c, int r, int n) {
  enum { BIG = 100000 };
  double *v = tc_xmalloc(BIG * sizeof *v);
  for (int i = 0; i < BIG; i++) v[i] = i + r;
  TC_ASSERT_OK(tc_all_reduce(c, v, BIG, TC_FLOAT64, TC_OP(TC_SUM), NULL, NULL));
  for (int i = 0; i < BIG; i++)
    if (v[i] != (double)i * n + n * (n - 1) / 2)
      TC_ASSERT_DBL_NEAR(v[i], (double)i * n + n * (n - 1) / 2, 0);
  const int roots[2] = {0, n - 1};
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < BIG; i++) v[i] = r;
    TC_ASSERT_OK(tc_broadcast(c, v, BIG, TC_FLOAT64, roots[k], NULL, NULL));
    for (int i = 0; i < BIG; i++)
      if (v[i] != roots[k]) TC_ASSERT_DBL_NEAR(v[i], roots[k], 0);
  }
  int32_t mine[3] = {r, -r, 7 * r}, all[4][3];
  void *outs[4] = {all[0], all[1], all[2], all[3]};
  TC_ASSERT_OK(tc_all_gather(c, outs, mine, 3, TC_INT32, NULL, NULL));
  for (int i = 0; i < n; i++) {
    TC_ASSERT_EQ(all[i][0], i);
    TC_ASSERT_EQ(all[i][1], -i);
    TC_ASSERT_EQ(all[i][2], 7 * i);
  }
  /* a ring, both directions posted before either is waited for */
  int64_t s = 1000 + r, got = -1;
  tc_work_t *ws, *wr;
  TC_ASSERT_OK(tc_send(c, &s, 1, TC_INT64, (r + 1) % n, NULL, &ws));
  TC_ASSERT_OK(tc_recv(c, &got, 1, TC_INT64, (r + n - 1) % n, NULL, &wr));
  TC_ASSERT_OK(tc_work_wait(wr));
  TC_ASSERT_OK(tc_work_wait(ws));
  tc_work_release(ws);
  tc_work_release(wr);
  TC_ASSERT_EQ(got, 1000 + (r + n - 1) % n);
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  free(v);
}

static void *rank_thread(void *p) {
  rank_arg_t *a = p;
  tc_store_t *store = a->store;
  if (a->store_kind == CLIENT_PER_THREAD)
    TC_ASSERT_OK(tc_store_tcp_connect("127.0.0.1", a->port, 10.0, &store));
  for (int round = 0; round < 2; round++) { /* the name again: new keys */
    tc_comm_t *c = thread_comm(a, a->name, a->rank, store);
    /* and a second communicator (ranks reversed) created while c lives */
    char other[64];
    snprintf(other, sizeof other, "%s_rev", a->name);
    tc_comm_t *d = thread_comm(a, other, a->size - 1 - a->rank, store);
    exercise(c, a->rank, a->size);
    exercise(d, a->size - 1 - a->rank, a->size);
    TC_ASSERT_OK(tc_comm_finalize(d));
    TC_ASSERT_OK(tc_comm_finalize(c));
    TC_ASSERT_OK(tc_comm_destroy(d));
    TC_ASSERT_OK(tc_comm_destroy(c));
  }
  if (a->store_kind == CLIENT_PER_THREAD) tc_store_release(store);
  return NULL;
}

static void ranks_as_threads(int n, const char *transport, int store_kind) {
  setenv("TORCHCOMMS_CPU_TRANSPORT", transport, 1); /* before any thread */
  tc_store_server_t *srv = NULL;
  tc_store_t *store = NULL;
  int port = 0;
  if (store_kind == SHARED_CLIENT || store_kind == CLIENT_PER_THREAD) {
    TC_ASSERT_OK(tc_store_server_start("127.0.0.1", 0, &srv));
    port = tc_store_server_port(srv);
    if (store_kind == SHARED_CLIENT)
      TC_ASSERT_OK(tc_store_tcp_connect("127.0.0.1", port, 10.0, &store));
  } else if (store_kind == MEMORY) {
    TC_ASSERT_OK(tc_store_memory(&store));
  } else { /* the default store: a free port for rank 0's server */
    char p[16];
    snprintf(p, sizeof p, "%d", tc_free_port());
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", p, 1);
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
  }
  rank_arg_t a[8];
  pthread_t th[8];
  TC_ASSERT(n <= 8);
  double t0 = tc__now();
  for (int r = 0; r < n; r++) {
    a[r] = (rank_arg_t){.rank = r, .size = n, .store_kind = store_kind, .port = port,
                        .store = store, .name = "threads"};
    TC_ASSERT_EQ(pthread_create(&th[r], NULL, rank_thread, &a[r]), 0);
  }
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL); /* the test's deadline bounds it */
  /* ~0.1 s; threads taking turns in the store would wait out timeouts */
  if (tc__now() - t0 > 10.0)
    tc_test_fail(__FILE__, __LINE__, "%d ranks as threads over %s took %.1f s", n,
                 transport, tc__now() - t0);
  if (store) tc_store_release(store);
  if (srv) tc_store_server_stop(srv);
}

TC_TEST(threads_shm_shared_client_w2) { ranks_as_threads(2, "shm", SHARED_CLIENT); }
TC_TEST(threads_shm_shared_client_w4) { ranks_as_threads(4, "shm", SHARED_CLIENT); }
TC_TEST(threads_tcp_shared_client_w4) { ranks_as_threads(4, "tcp", SHARED_CLIENT); }
TC_TEST(threads_shm_client_per_thread_w3) { ranks_as_threads(3, "shm", CLIENT_PER_THREAD); }
TC_TEST(threads_tcp_client_per_thread_w3) { ranks_as_threads(3, "tcp", CLIENT_PER_THREAD); }
TC_TEST(threads_shm_memory_w4) { ranks_as_threads(4, "shm", MEMORY); }
TC_TEST(threads_tcp_memory_w2) { ranks_as_threads(2, "tcp", MEMORY); }
TC_TEST(threads_shm_default_store_w4) { ranks_as_threads(4, "shm", DEFAULT_STORE); }
TC_TEST(threads_tcp_default_store_w2) { ranks_as_threads(2, "tcp", DEFAULT_STORE); }

/* ---- several threads issuing on ONE communicator ---- */

/* The communicator's lock (tc__lock_t, core.h: no locked instruction to
 * give it back, a futex for the threads that wait) under contention: 4
 * threads each run 20000 synchronous and 2000 asynchronous operations on
 * one world-of-one communicator; every result is checked and the
 * communicator numbered every operation exactly once. */
typedef struct {
  tc_comm_t *c;
  int id, bad;
} shared_arg_t;

enum { SHARED_THREADS = 4, SHARED_SYNC = 20000, SHARED_ASYNC = 2000 };

static void *shared_ops(void *p) {
  shared_arg_t *a = p;
  for (int i = 0; i < SHARED_SYNC; i++) {
    int64_t v[2] = {a->id * 1000000 + i, -i};
    if (tc_all_reduce(a->c, v, 2, TC_INT64, TC_OP(TC_SUM), NULL, NULL) != TC_OK ||
        v[0] != a->id * 1000000 + i || v[1] != -i)
      a->bad++;
  }
  for (int i = 0; i < SHARED_ASYNC; i++) {
    int32_t v = i;
    tc_work_t *w = NULL;
    if (tc_all_reduce(a->c, &v, 1, TC_INT32, TC_OP(TC_MAX), NULL, &w) != TC_OK ||
        tc_work_wait(w) != TC_OK || tc_work_release(w) != TC_OK || v != i)
      a->bad++;
  }
  return NULL;
}

TC_TEST(threads_one_comm_contended) {
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(tc_world1_create("contended", "cpu", &c));
  pthread_t t[SHARED_THREADS];
  shared_arg_t a[SHARED_THREADS];
  for (int i = 0; i < SHARED_THREADS; i++) {
    a[i] = (shared_arg_t){.c = c, .id = i, .bad = 0};
    TC_ASSERT_EQ(pthread_create(&t[i], NULL, shared_ops, &a[i]), 0);
  }
  for (int i = 0; i < SHARED_THREADS; i++) {
    TC_ASSERT_EQ(pthread_join(t[i], NULL), 0);
    TC_ASSERT_EQ(a[i].bad, 0);
  }
  tc_comm_t *cs = c;
  TC_ASSERT_OK(tc__comm_enter(&cs, "test"));
  TC_ASSERT_EQ(cs->seq, (uint64_t)SHARED_THREADS * (SHARED_SYNC + SHARED_ASYNC));
  TC_ASSERT_EQ(atomic_load(&cs->mu.state), 0);
  TC_ASSERT_EQ(atomic_load(&cs->mu.sleepers), 0);
  TC_ASSERT_OK(tc_comm_destroy(c));
}
