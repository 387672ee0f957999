/* library.c -- what the library says about itself and what it gives back:
 * tc_version, tc_free (for memory the library allocated, e.g. store values). */
#include "internal.h"

#include <stdlib.h>

const char *tc_version(void) { return TC_VERSION_STRING; }
void tc_free(void *ptr) { free(ptr); }
