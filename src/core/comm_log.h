/* comm_log.h -- what the core logs about a communicator (comm_log.c). */
#ifndef TC_COMM_LOG_H
#define TC_COMM_LOG_H

#include "core.h"

/* Called by tc_comm_create once the communicator works: makes its rank the
 * process's rank in log tags (the first communicator's; tc__log_set_rank)
 * and logs the init summary at info level, subsystem init: the backend and
 * its version, rank and size, device, timeout, what the backend chose
 * (tc_backend_ops_t.describe: the transport per peer, thresholds, waiting),
 * and every setting whose value differs from its default. */
TC_INTERNAL void tc__comm_log_created(const tc_comm_t *c);

#endif
