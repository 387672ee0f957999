/* test_scaling.c -- what a rank holds and asks for as communicators grow
 * (issue 17, docs/scaling.md): tcscale under tcrun at 32 ranks over TCP.
 * A lazy mesh connects a rank only to the peers its algorithms use, so
 * after an 8-byte all_reduce a rank holds at most 12 sockets (the listening
 * one included; an eager mesh holds 32), and creation asks the store for a
 * number of requests that grows with log2(n), not n. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner.h"

/* Runs `tcrun -n n tcscale` with extra environment `env`; its summary line
 * ("n=32 transport=... create_req=a/b/c ... sockets=a/b/c ...") in line. */
static void tcscale(int n, const char *env, char *line, size_t len) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "env TORCHCOMMS_CPU_TRANSPORT=tcp %s TORCHCOMM_TIMEOUT_SECONDS=120 "
           "%s/tcrun -n %d --timeout 240 %s/tcscale --label tcp 2>&1",
           env, TC_BUILD_DIR, n, TC_BUILD_DIR);
  FILE *p = popen(cmd, "r");
  TC_ASSERT(p != NULL);
  char buf[1024];
  line[0] = 0;
  while (fgets(buf, sizeof buf, p))
    if (!strncmp(buf, "n=", 2)) snprintf(line, len, "%s", buf);
    else fputs(buf, stdout); /* anything else is an error worth seeing */
  int st = pclose(p);
  TC_ASSERT_EQ(st, 0);
  TC_ASSERT(line[0] != 0);
  printf("  %s", line);
}

/* The min/median/max triple after "name=". */
static void triple(const char *line, const char *name, int v[3]) {
  char key[64];
  snprintf(key, sizeof key, " %s=", name);
  const char *s = strstr(line, key);
  TC_ASSERT(s != NULL);
  TC_ASSERT_EQ(sscanf(s + strlen(key), "%d/%d/%d", &v[0], &v[1], &v[2]), 3);
}

TC_TEST(scaling_lazy_mesh_32_ranks) {
  char line[4096];
  int sock[3], req[3];
  tcscale(32, "", line, sizeof line);
  triple(line, "sockets", sock);
  triple(line, "create_req", req);
  /* log2(32) = 5: the all-gathers' partners at distances 1, 2, 4, 8, 16 on
   * either side (9 peers) and recursive doubling's (among them), plus the
   * listening socket */
  TC_ASSERT(sock[2] <= 12);
  TC_ASSERT(sock[0] >= 6);
  /* a constant part (arrival, token, address, CPU mask, deletions) and one
   * address read per lower partner: far below one per peer (31) */
  TC_ASSERT(req[2] <= 24);
}

TC_TEST(scaling_eager_mesh_32_ranks) {
  char line[4096];
  int sock[3];
  tcscale(32, "TORCHCOMMS_CPU_EAGER=1", line, sizeof line);
  triple(line, "sockets", sock);
  /* every pair connected at creation: 31 peers and the listening socket
   * (closed once every peer is connected) */
  TC_ASSERT_EQ(sock[0], 31);
  TC_ASSERT_EQ(sock[2], 31);
}
