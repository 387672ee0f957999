/* default_store.c -- the job's store when the caller gives none:
 *  - world size 1 and no MASTER_ADDR: an in-process store;
 *  - TORCHELASTIC_USE_AGENT_STORE=True (torchrun, tcrun): every rank is a
 *    client of the launcher's store at MASTER_ADDR:MASTER_PORT;
 *  - otherwise rank 0 hosts a TCPStore server on MASTER_PORT and every rank
 *    (rank 0 included) connects to MASTER_ADDR:MASTER_PORT as a client.
 * One store per process, shared by every communicator (keys are prefixed per
 * communicator), and by every rank when several ranks are threads of one
 * process. */
#include "bootstrap/bootstrap.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t ds_mu = PTHREAD_MUTEX_INITIALIZER;
static tc_store_t *ds_store;
static tc_store_server_t *ds_server;

/* ds_mu guards the two pointers only and is never held while connecting:
 * several ranks may be threads of one process, and a rank that is not 0
 * waits in tc_store_tcp_connect until rank 0's thread has started the
 * server, which it does under ds_mu. The first connection made is kept; a
 * thread that connected meanwhile drops its own and shares it (the client
 * takes requests from several threads at once: tcp_store_client.c). */
int tc__default_store(int rank, int size, double timeout_s, tc_store_t **out) {
  pthread_mutex_lock(&ds_mu);
  int rc = TC_OK;
  tc_store_t *mine = NULL;
  if (ds_store) goto done;
  const char *addr = tc__env_str("MASTER_ADDR");
  const char *port_s = tc__env_str("MASTER_PORT");
  if (!addr || !port_s) {
    if (size == 1) {
      rc = tc_store_memory(&ds_store);
      goto done;
    }
    rc = tc__set_error(TC_ERR_INVALID_USAGE,
                       "torchcomms: tc_comm_create (rank %d of %d): no store: "
                       "MASTER_ADDR and MASTER_PORT are not set (launch with "
                       "tcrun or torchrun, set them, or pass a store)",
                       rank, size);
    goto done;
  }
  char *end = NULL;
  long port = strtol(port_s, &end, 10);
  if (*end || port <= 0 || port > 65535) {
    rc = tc__set_error(TC_ERR_INVALID_ARGUMENT,
                       "torchcomms: tc_comm_create: MASTER_PORT='%s' is not a "
                       "port number", port_s);
    goto done;
  }
  const char *agent = tc__env_str("TORCHELASTIC_USE_AGENT_STORE");
  int use_agent = agent && !strcmp(agent, "True");
  if (!use_agent && rank == 0 && !ds_server) {
    rc = tc_store_server_start("0.0.0.0", (int)port, &ds_server);
    if (rc != TC_OK) goto done;
  }
  pthread_mutex_unlock(&ds_mu);
  rc = tc_store_tcp_connect(addr, (int)port, timeout_s, &mine);
  pthread_mutex_lock(&ds_mu);
  if (rc == TC_OK && !ds_store) {
    ds_store = mine;
    mine = NULL;
  } else if (rc != TC_OK && ds_store) {
    rc = TC_OK; /* another thread connected: share its connection */
  }
done:
  if (rc == TC_OK) {
    tc_store_retain(ds_store);
    *out = ds_store;
  }
  pthread_mutex_unlock(&ds_mu);
  if (mine) tc_store_release(mine); /* another thread's came first */
  return rc;
}
