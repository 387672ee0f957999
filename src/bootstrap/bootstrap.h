/* bootstrap.h -- what the bootstrap layer (src/bootstrap/) offers the core
 * beyond the public store API of torchcomms.h (tc_store_*, tc_env_rank_size).
 * Deliberately shared across layers: the core includes this header, never
 * store_internal.h. */
#ifndef TC_BOOTSTRAP_H
#define TC_BOOTSTRAP_H

#include "core/internal.h"

/* The job's store when the caller passes none (default_store.c): in-process
 * for a world of one without MASTER_ADDR, else a client of
 * MASTER_ADDR:MASTER_PORT (rank 0 hosting the server unless
 * TORCHELASTIC_USE_AGENT_STORE=True). One per process, shared by every
 * communicator; *out receives a new reference. */
TC_INTERNAL int tc__default_store(int rank, int size, double timeout_s,
                                  tc_store_t **out);

#endif /* TC_BOOTSTRAP_H */
