/* dtype.c -- element sizes and names of the data types and reductions. */
#include "internal.h"

/* Every storage type in TC_DTYPE_MAP has the size the map states. */
#define TC__DTYPE_SIZE_CHECK(name, val, ctype, size, isf)                      \
  _Static_assert(sizeof(ctype) == (size), "size of TC_" #name);
TC_DTYPE_MAP(TC__DTYPE_SIZE_CHECK)
#undef TC__DTYPE_SIZE_CHECK

/* Size in bytes of one element, from TC_DTYPE_MAP; 0 when invalid. */
size_t tc_dtype_size(tc_dtype_t dtype) { return tc__dtype_size(dtype); }

/* Lower-case names (torch's spelling without "torch."); the preprocessor
 * cannot lower-case the map's names, so they are listed, and the assert
 * below keeps the list as long as the map. */
static const char *const dtype_names[] = {
    [TC_FLOAT32] = "float32", [TC_FLOAT64] = "float64",
    [TC_FLOAT16] = "float16", [TC_BFLOAT16] = "bfloat16",
    [TC_INT8] = "int8",       [TC_UINT8] = "uint8",
    [TC_INT16] = "int16",     [TC_INT32] = "int32",
    [TC_INT64] = "int64",     [TC_BOOL] = "bool",
    [TC_FLOAT8_E4M3FN] = "float8_e4m3fn",
    [TC_FLOAT8_E5M2] = "float8_e5m2",
};
_Static_assert(sizeof dtype_names / sizeof dtype_names[0] ==
                   TC_DTYPE_COUNT,
               "a name for every dtype");

/* Lower-case name of a dtype ("float32"), or "invalid". */
const char *tc_dtype_name(tc_dtype_t dtype) {
  if ((unsigned)dtype >= TC_DTYPE_COUNT || !dtype_names[dtype])
    return "invalid";
  return dtype_names[dtype];
}

static const char *const redop_names[] = {
    [TC_SUM] = "SUM",   [TC_PRODUCT] = "PRODUCT", [TC_MIN] = "MIN",
    [TC_MAX] = "MAX",   [TC_BAND] = "BAND",       [TC_BOR] = "BOR",
    [TC_BXOR] = "BXOR", [TC_AVG] = "AVG",         [TC_PREMUL_SUM] = "PREMUL_SUM",
};
_Static_assert(sizeof redop_names / sizeof redop_names[0] ==
                   TC_REDOP_COUNT,
               "a name for every reduction");

/* Upper-case name of a reduction ("SUM"), or "invalid". */
const char *tc_redop_name(tc_redop_type_t op) {
  if ((unsigned)op >= TC_REDOP_COUNT || !redop_names[op]) return "invalid";
  return redop_names[op];
}
