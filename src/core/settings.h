/* settings.h -- every environment setting of the library, declared once
 * (TC_SETTINGS_MAP), and the typed accessors that read it (settings.c).
 *
 * A reader never names a variable nor writes its default: it asks
 * tc__setting_double(TC_SET_CPU_INLINE_BYTES) and gets the value of the
 * current snapshot, or the table's default when unset. The snapshot is read
 * from the environment, parsed and checked once, and re-read only by
 * tc__settings_reload: at tc_comm_create (which refuses a malformed value,
 * naming the setting) and when a store server starts. Readers in between --
 * a split, the transports, the logger -- see the snapshot, never a value
 * changed in the environment meanwhile. See README's settings section. */
#ifndef TC_SETTINGS_H
#define TC_SETTINGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "torchcomms_backend.h" /* TC_LOG_ALL */

#define TC__BIG 1e18

/* X(ID, NAME, KIND, DEFAULT, MIN, MAX, CHOICES, HELP)
 *  KIND     NUM: a number in [MIN, MAX]; NUMP: in (MIN, MAX]; INT: a whole
 *           number in [MIN, MAX]; BOOL: 1/0/true/false/yes/no/on/off;
 *           CHOICE: one of CHOICES ("a|b|c", case-insensitive), DEFAULT is
 *           the index of the default; FLAGS: a comma list of CHOICES
 *           (bit i for choice i), "all", or "^list" (all but those);
 *           DEFAULT is the mask; TEXT, ADDR (a numeric IPv4/IPv6
 *           address): no default, unset reads NULL; BYTES: a byte count
 *           with an optional K, M, G or T suffix (powers of 1024).
 *  DEFAULT  the value when unset (a number; CHOICE: an index). Printed by
 *           tcrun --help-env after HELP unless HELP says "(default".
 *  HELP     one line.
 * Declared here but read by code that cannot link the core (the nccl plugin,
 * Python) or that parses them together with other launchers' variables
 * (tc_env_rank_size): TORCHCOMM_RANK/SIZE, TORCHCOMMS_NCCL_*,
 * TORCHCOMMS_CUDART_LIB, TORCHCOMMS_SERIALIZATION; they are still listed
 * and checked at creation. */
#define TC_SETTINGS_MAP(X)                                                                \
  X(TIMEOUT_SECONDS, "TORCHCOMM_TIMEOUT_SECONDS", NUMP, TC_DEFAULT_TIMEOUT_S, 0, TC__BIG,  \
    NULL, "default deadline of every operation and of creation, seconds")                \
  X(ABORT_ON_ERROR, "TORCHCOMM_ABORT_ON_ERROR", BOOL, 0, 0, 0, NULL,                       \
    "end the process with the error on any failure")                                     \
  X(LOG, "TORCHCOMMS_LOG", CHOICE, 1, 0, 0, "error|warn|info|debug|trace", "log level")    \
  X(CLOCK, "TORCHCOMMS_CLOCK", CHOICE, 0, 0, 0, "auto|os",                                 \
    "auto: the time-stamp counter where the kernel's clock runs on it; os: clock_gettime") \
  X(LOG_SUBSYS, "TORCHCOMMS_LOG_SUBSYS", FLAGS, TC_LOG_ALL, 0, 0,                          \
    "init|coll|p2p|shm|tcp|store|misc",                                                  \
    "subsystems whose info/debug/trace lines are logged: a list, all, ^list excludes")   \
  X(LOG_FILE, "TORCHCOMMS_LOG_FILE", TEXT, 0, 0, 0, NULL,                                  \
    "log to this file instead of stderr (%r rank, %p pid, %h host name)")                \
  X(JOB_ID, "TORCHCOMMS_JOB_ID", TEXT, 0, 0, 0, NULL,                                      \
    "scopes store keys per job (default TORCHELASTIC_RUN_ID)")                           \
  X(RESTART_COUNT, "TORCHELASTIC_RESTART_COUNT", INT, 0, 0, 1e9, NULL,                     \
    "torchrun's restart number: scopes store keys")                                      \
  X(CHECK_MISMATCH, "TORCHCOMMS_CHECK_MISMATCH", BOOL, 1, 0, 0, NULL,                      \
    "compare every collective's op, dtype, count, root and reduction across ranks")      \
  X(SOCKET_ADDR, "TORCHCOMMS_SOCKET_ADDR", ADDR, 0, 0, 0, NULL,                            \
    "the address this rank's peers connect to")                                          \
  X(CPU_TRANSPORT, "TORCHCOMMS_CPU_TRANSPORT", CHOICE, 0, 0, 0, "auto|shm|tcp",            \
    "cpu backend transport")                                                             \
  X(SHM_BYTES, "TORCHCOMMS_SHM_BYTES", NUMP, 4 << 20, 0, 1ull << 40, NULL,                 \
    "shared-memory segment bytes per rank")                                              \
  X(SHM_MEMBARRIER, "TORCHCOMMS_SHM_MEMBARRIER", BOOL, 1, 0, 0, NULL,                     \
    "shm: a small broadcast posts without a fence; a waiter about to sleep calls membarrier instead (the same on every rank)") \
  X(EXPRESS, "TORCHCOMMS_EXPRESS", BOOL, 1, 0, 0, NULL,                                    \
    "synchronous collectives the backend can run at once skip the work object (0: never)") \
  X(CPU_CMA, "TORCHCOMMS_CPU_CMA", BOOL, 1, 0, 0, NULL,                                    \
    "single copy with process_vm_readv")                                                 \
  X(CPU_CMA_BYTES, "TORCHCOMMS_CPU_CMA_BYTES", BYTES, 0, 0, 0, NULL,                        \
    "collectives: single copy from this many bytes (0: never; unset: measured at creation; the same on every rank)") \
  X(CPU_INLINE_BYTES, "TORCHCOMMS_CPU_INLINE_BYTES", BYTES, 1 << 20, 0, 0, NULL,            \
    "run asynchronous operations up to this size (synchronous ones: any) on the caller's thread (0: never)")                             \
  X(CPU_STREAM_BYTES, "TORCHCOMMS_CPU_STREAM_BYTES", BYTES, 0, 0, 0, NULL,                  \
    "shm: copy blocks of at least this size out of the shared segments with streaming stores (unset: 8 MiB or the L3 cache / (8 x ranks), the larger)") \
  X(CPU_SHM_SMALL_BYTES, "TORCHCOMMS_CPU_SHM_SMALL_BYTES", BYTES, 8 << 10, 0, 0,           \
    NULL, "shm all_reduce through the small slots up to this size (the same on every rank)") \
  X(CPU_SPIN_US, "TORCHCOMMS_CPU_SPIN_US", NUM, 0, 0, 1e9, NULL,                           \
    "busy-wait before sleeping, microseconds (default 200 when ranks <= cores, else 0)")  \
  X(CPU_TCP_SPIN_US, "TORCHCOMMS_CPU_TCP_SPIN_US", NUM, 0, 0, 1e9, NULL,                   \
    "TCP busy-poll before sleeping, microseconds (default as TORCHCOMMS_CPU_SPIN_US)")   \
  X(CPU_YIELD_US, "TORCHCOMMS_CPU_YIELD_US", NUM, 200, 0, 1e9, NULL,                       \
    "oversubscribed: sched_yield polling before sleeping, microseconds")                 \
  X(CPU_HIER, "TORCHCOMMS_CPU_HIER", CHOICE, 0, 0, 0, "auto|0|1",                          \
    "cpu backend across hosts: shm per host + TCP between hosts' leaders (auto: when a host has 2+ ranks)") \
  X(CPU_HIER_FAKE_HOSTS, "TORCHCOMMS_CPU_HIER_FAKE_HOSTS", INT, 0, -4096, 4096, NULL,      \
    "tests only: K > 0 puts rank r on fake host r*K/size, K < 0 on host r mod -K")        \
  X(CPU_EAGER, "TORCHCOMMS_CPU_EAGER", BOOL, 0, 0, 0, NULL,                               \
    "connect every pair of ranks at creation (default: a pair when it first talks)")      \
  X(CPU_IFNAME, "TORCHCOMMS_CPU_IFNAME", TEXT, 0, 0, 0, NULL,                              \
    "network interface whose address TCP binds and publishes")                           \
  X(SHM_SWEEP, "TORCHCOMMS_SHM_SWEEP", BOOL, 1, 0, 0, NULL,                                \
    "remove /dev/shm segments of dead creators at setup")                                \
  X(STORE_MAX_BYTES, "TORCHCOMMS_STORE_MAX_BYTES", BYTES, 1 << 30, 1 << 20, 0, NULL,       \
    "store server memory budget")                                                        \
  X(STORE_MAX_VALUE_BYTES, "TORCHCOMMS_STORE_MAX_VALUE_BYTES", BYTES, 256 << 20, 1024, 0,  \
    NULL, "largest value the store server accepts")                                      \
  X(STORE_MAX_UNSENT_BYTES, "TORCHCOMMS_STORE_MAX_UNSENT_BYTES", BYTES, 16 << 20, 4096, 0, \
    NULL, "unsent answers per store client before the server stops reading it")          \
  X(RANK, "TORCHCOMM_RANK", TEXT, 0, 0, 0, NULL,                                           \
    "this process's rank, with TORCHCOMM_SIZE (read by tc_env_rank_size)")               \
  X(SIZE, "TORCHCOMM_SIZE", TEXT, 0, 0, 0, NULL,                                           \
    "the job's world size, with TORCHCOMM_RANK (read by tc_env_rank_size)")              \
  X(NCCL_LIB, "TORCHCOMMS_NCCL_LIB", TEXT, 0, 0, 0, NULL,                                  \
    "the NCCL library the nccl backend loads (default libnccl.so.2, libnccl.so)")        \
  X(CUDART_LIB, "TORCHCOMMS_CUDART_LIB", TEXT, 0, 0, 0, NULL,                              \
    "the CUDA runtime the nccl backend loads (default libcudart.so.12, ...)")            \
  X(MPI_SMALL_BYTES, "TORCHCOMMS_MPI_SMALL_BYTES", NUM, 32768, 0, TC__BIG, NULL,           \
    "mpi backend: all_reduce up to this many bytes by recursive doubling over "           \
    "MPI_Isend/Irecv (broadcast: a binomial tree; equal-block all_gather: a ring), "      \
    "above it MPI's own (0: always MPI's own)")                                           \
  X(MPI_RING_BYTES, "TORCHCOMMS_MPI_RING_BYTES", NUM, 32768, 0, TC__BIG, NULL,           \
    "mpi backend: all_reduce from this many bytes by a ring of MPI_Isend/Irecv, "         \
    "below it MPI_Iallreduce (0: never the ring)")                                        \
  X(NCCL_FAKE_HOST, "TORCHCOMMS_NCCL_FAKE_HOST", CHOICE, 0, 0, 0, "0|1",                   \
    "tests only: 1 lets the nccl backend run on device cpu")                             \
  X(SERIALIZATION, "TORCHCOMMS_SERIALIZATION", TEXT, 0, 0, 0, NULL,                        \
    "Python object collectives: pickle, else torch.save")                                \
  X(FR_BUFFER_SIZE, "TORCH_FR_BUFFER_SIZE", INT, 2000, 0, 16777216, NULL,                  \
    "flight recorder: operations kept per communicator (0: off)")                        \
  X(FR_STACK, "TORCHCOMMS_FR_STACK", BOOL, 0, 0, 0, NULL,                                \
    "flight recorder: keep each operation's stack (Python frames from Python, then C)")  \
  X(FR_CPP_STACK, "TORCH_FR_CPP_STACK", BOOL, 0, 0, 0, NULL,                              \
    "flight recorder: as TORCHCOMMS_FR_STACK (torch's name)")                            \
  X(FR_DUMP_TEMP_FILE, "TORCH_FR_DUMP_TEMP_FILE", TEXT, 0, 0, 0, NULL,                     \
    "flight recorder: dump to <prefix><rank> on a timeout, a lost peer or an abort")     \
  X(FR_DUMP_TEMP_FILE_TC, "TORCHCOMM_FR_DUMP_TEMP_FILE", TEXT, 0, 0, 0, NULL,              \
    "as TORCH_FR_DUMP_TEMP_FILE (torchcomms' name; it wins over torch's)")          \
  X(HANG_REPORT, "TORCHCOMMS_HANG_REPORT", BOOL, 1, 0, 0, NULL,                           \
    "explain a timeout or a lost peer: which ranks are behind, and where")               \
  X(HANG_REPORT_BOARD, "TORCHCOMMS_HANG_REPORT_BOARD", BOOL, 1, 0, 0, NULL,               \
    "hang report: read peers on this host from shared memory (0: ask the store, as across hosts)") \
  X(HANG_REPORT_S, "TORCHCOMMS_HANG_REPORT_S", NUM, 2, 0, 60, NULL,                        \
    "hang report: longest wait for ranks on other hosts, seconds")                       \
  X(PY_TENSOR_SHIM, "TORCHCOMMS_PY_TENSOR_SHIM", BOOL, 1, 0, 0, NULL,                      \
    "Python package: read torch tensors through torch's C shim where checked (0: DLPack)")

/* For BYTES, MIN is the least useful value: a smaller one is raised to it
 * (logged), MAX is unused. */

typedef enum tc_setting_id {
#define TC__SET_ENUM(id, name, kind, dflt, lo, hi, choices, help) TC_SET_##id,
  TC_SETTINGS_MAP(TC__SET_ENUM)
#undef TC__SET_ENUM
  TC_SET_COUNT
} tc_setting_id_t;

#define TC_INTERNAL_SETTINGS __attribute__((visibility("hidden")))

/* The value of a setting in the current snapshot (read on first use if no
 * snapshot was taken yet); the table's default when unset or malformed. */
TC_INTERNAL_SETTINGS double tc__setting_double(tc_setting_id_t id); /* NUM, NUMP, INT */
TC_INTERNAL_SETTINGS int tc__setting_bool(tc_setting_id_t id);      /* BOOL: 0 or 1 */
TC_INTERNAL_SETTINGS int tc__setting_choice(tc_setting_id_t id);    /* CHOICE: index */
TC_INTERNAL_SETTINGS uint32_t tc__setting_flags(tc_setting_id_t id);   /* FLAGS: mask */
TC_INTERNAL_SETTINGS uint64_t tc__setting_bytes(tc_setting_id_t id);   /* BYTES, >= MIN */
/* The text as set (any kind); NULL when unset or empty. Stays valid for the
 * life of the process, also after a reload. */
TC_INTERNAL_SETTINGS const char *tc__setting_str(tc_setting_id_t id);
/* 1 when the setting is set (not empty) in the snapshot; 1 when it is set
 * but malformed (it then reads as its default). */
TC_INTERNAL_SETTINGS int tc__setting_is_set(tc_setting_id_t id);
TC_INTERNAL_SETTINGS int tc__setting_malformed(tc_setting_id_t id);
TC_INTERNAL_SETTINGS const char *tc__setting_name(tc_setting_id_t id);
/* 1 when the setting is set and its value differs from the table's default
 * (TEXT, ADDR: set at all; malformed: 1), for the init summary. */
TC_INTERNAL_SETTINGS int tc__setting_differs(tc_setting_id_t id);

/* Takes a new snapshot of every setting from the environment. Returns
 * TC_OK, or TC_ERR_INVALID_ARGUMENT with "NAME='value' is not valid:
 * expected ... (help)" in err (when err is not NULL) for the first
 * malformed value; malformed values read as their default. With err NULL
 * each malformed value is logged as a warning instead. Thread-safe: a
 * concurrent reader gets the old or the new value of each setting. */
TC_INTERNAL_SETTINGS int tc__settings_reload(char *err, size_t len);

/* getenv, NULL when unset or empty, for variables that are not settings of
 * ours: torchrun's and other launchers' (MASTER_ADDR, MASTER_PORT,
 * TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE, RANK/WORLD_SIZE and the
 * pairs of tc_env_rank_size, which reads TORCHCOMM_RANK/SIZE with them) and
 * TORCHCOMMS_BACKEND_LIB_PATH_<NAME>, whose name is made at run time. Read
 * at each call, not cached. */
TC_INTERNAL_SETTINGS const char *tc__env_str(const char *name);

/* A byte count: digits with an optional K, M, G or T suffix (powers of
 * 1024; "Ki", a trailing "B" allowed). 0 and *out set, or -1. */
TC_INTERNAL_SETTINGS int tc__parse_bytes(const char *text, uint64_t *out);
/* The byte count `text` (NULL: dflt); dflt when malformed, at least `least`
 * (both logged, naming `name`). */
TC_INTERNAL_SETTINGS uint64_t tc__bytes_value(const char *name, const char *text,
                                              uint64_t dflt, uint64_t least);

/* The table, for listings and tests: count, name and help of entry i, and
 * its default as printed ("600", "16 KiB", "warn"; "" when none). */
TC_INTERNAL_SETTINGS size_t tc__settings_count(void);
TC_INTERNAL_SETTINGS const char *tc__settings_name(size_t i, const char **help);
TC_INTERNAL_SETTINGS void tc__settings_default_text(size_t i, char *buf, size_t len);
/* Prints every declared setting, its help, default and value when set:
 * tcrun --help-env. */
TC_INTERNAL_SETTINGS void tc__settings_print(FILE *f);

#endif
