/* safetensors files: memory-mapped, header validated before any tensor is touched.
 * Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
 * then the data section. Every offset, size and dtype is checked; a bad file is an error naming the
 * file and the tensor, never a crash. */
#ifndef DI_MODEL_SAFETENSORS_H
#define DI_MODEL_SAFETENSORS_H
#include <stdint.h>
#include <stddef.h>
#include "util/status.h"
#include "model/weights.h"

#define DI_ST_MAX_DIMS 8

typedef struct di_st_tensor {
  char *name;
  int dtype;                 /* a di_dtype, or -1 for a dtype DeepInfer does not compute with */
  char dtype_name[16];
  int ndim;
  int64_t shape[DI_ST_MAX_DIMS];
  const void *data;
  size_t nbytes;
  const char *file;          /* path of the file holding it */
} di_st_tensor;

typedef struct di_st_file {
  char *path;
  void *map;                 /* whole file mapping (or caller's buffer when parsed from memory) */
  size_t map_len;
  int owns_map;
  di_st_tensor *tensors;
  int n_tensors;
} di_st_file;

/* Parses and validates the header of a safetensors image held in memory (no copy of the data).
 * `what` names the file in error messages. On success `out` must be released with di_st_file_close. */
di_status di_st_parse(const uint8_t *buf, size_t len, const char *what, di_st_file *out);
/* Maps and parses a file. */
di_status di_st_open(const char *path, di_st_file *out);
void di_st_file_close(di_st_file *f);
/* The tensor called `name` in one file (linear search; NULL when absent). */
const di_st_tensor *di_st_file_find(const di_st_file *f, const char *name);

/* A model's tensors across one or more files (model.safetensors, or the shards named by
 * model.safetensors.index.json), looked up by name. */
typedef struct di_tensor_source di_tensor_source;
di_status di_tensor_source_open(const char *dir, di_tensor_source **out);
void di_tensor_source_free(di_tensor_source *s);
/* A source over one safetensors image in memory (the caller's buffer, not copied; it must outlive the
 * source): what the loaders see, for the fuzz target of weight binding. `what` names it in errors. */
di_status di_tensor_source_from_memory(const uint8_t *buf, size_t len, const char *what, di_tensor_source **out);
/* NULL when absent. */
const di_st_tensor *di_tensor_source_find(const di_tensor_source *s, const char *name);
int di_tensor_source_count(const di_tensor_source *s);
const char *di_tensor_source_describe(const di_tensor_source *s); /* "dir (N files)" */
/* Looks up `name` and checks it is 2-D [rows][cols] (or 1-D [cols] when rows == 0) with a dtype the
 * kernels handle; binds its FP8 scales (`name` + "_scale_inv", F32 or F8_E8M0) when it is F8_E4M3
 * with the given block size. Errors name the tensor and its file. */
di_status di_tensor_source_weight(const di_tensor_source *s, const char *name, int64_t rows, int64_t cols,
                                  const int fp8_block[2], di_weight *out);
#endif
