/* safetensors parsing and the multi-file tensor source (see safetensors.h). */
#include "model/safetensors.h"
#include "util/json.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (256u << 20)

static int dtype_from_name(const char *s, size_t *elem) {
  static const struct { const char *n; int dt; size_t sz; } T[] = {
      {"F32", DI_DT_F32, 4}, {"BF16", DI_DT_BF16, 2}, {"F16", DI_DT_F16, 2}, {"F8_E4M3", DI_DT_F8E4M3, 1},
      {"I32", DI_DT_I32, 4}, {"I64", DI_DT_I64, 8},   {"F64", -1, 8},        {"I8", -1, 1},
      {"U8", -1, 1},         {"I16", -1, 2},          {"U16", -1, 2},        {"U32", -1, 4},
      {"U64", -1, 8},        {"BOOL", -1, 1},         {"F8_E5M2", -1, 1},    {"F8_E8M0", DI_DT_E8M0, 1}};
  for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
    if (strcmp(s, T[i].n) == 0) {
      *elem = T[i].sz;
      return T[i].dt;
    }
  *elem = 0;
  return -2;
}

static int cmp_by_offset(const void *a, const void *b) {
  const di_st_tensor *x = a, *y = b;
  const char *px = x->data, *py = y->data;
  return px < py ? -1 : px > py ? 1 : 0;
}

void di_st_file_close(di_st_file *f) {
  if (!f)
    return;
  for (int i = 0; i < f->n_tensors; i++)
    free(f->tensors[i].name);
  free(f->tensors);
  if (f->owns_map && f->map)
    munmap(f->map, f->map_len);
  free(f->path);
  memset(f, 0, sizeof *f);
}

const di_st_tensor *di_st_file_find(const di_st_file *f, const char *name) {
  for (int i = 0; i < f->n_tensors; i++)
    if (strcmp(f->tensors[i].name, name) == 0)
      return &f->tensors[i];
  return NULL;
}

di_status di_st_parse(const uint8_t *buf, size_t len, const char *what, di_st_file *out) {
  memset(out, 0, sizeof *out);
  if (len < 8)
    return di_error_set(DI_ERR_FORMAT, "%s: not a safetensors file (%zu bytes, shorter than the 8-byte header length)", what, len);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--)
    hlen = (hlen << 8) | buf[i];
  if (hlen > len - 8 || hlen > ST_MAX_HEADER)
    return di_error_set(DI_ERR_FORMAT, "%s: header length %llu exceeds the file size %zu (truncated or corrupt file)", what,
                        (unsigned long long)hlen, len);
  const uint8_t *data = buf + 8 + hlen;
  size_t data_len = len - 8 - (size_t)hlen;
  cJSON *root = NULL;
  char whatbuf[600];
  snprintf(whatbuf, sizeof whatbuf, "%s: header", what);
  DI_TRY(di_json_parse((const char *)buf + 8, (size_t)hlen, whatbuf, &root));
  di_status st = DI_OK;
  if (!cJSON_IsObject(root)) {
    st = di_error_set(DI_ERR_FORMAT, "%s: header is not a JSON object", what);
    goto done;
  }
  int n = 0;
  for (cJSON *e = root->child; e; e = e->next)
    n++;
  out->tensors = calloc((size_t)(n ? n : 1), sizeof(di_st_tensor));
  if (!out->tensors) {
    st = di_error_set(DI_ERR_OOM, "%s: out of memory", what);
    goto done;
  }
  for (cJSON *e = root->child; e; e = e->next) {
    if (strcmp(e->string, "__metadata__") == 0) {
      if (!cJSON_IsObject(e)) {
        st = di_error_set(DI_ERR_FORMAT, "%s: __metadata__ must be an object", what);
        goto done;
      }
      continue;
    }
    const char *name = e->string;
    di_st_tensor *t = &out->tensors[out->n_tensors];
    if (!cJSON_IsObject(e)) {
      st = di_error_set(DI_ERR_FORMAT, "%s: tensor '%s': entry is not an object", what, name);
      goto done;
    }
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2) {
      st = di_error_set(DI_ERR_FORMAT, "%s: tensor '%s': needs \"dtype\" (string), \"shape\" (array) and \"data_offsets\" ([begin, end])", what, name);
      goto done;
    }
    size_t elem;
    t->dtype = dtype_from_name(dt->valuestring, &elem);
    if (t->dtype == -2) {
      st = di_error_set(DI_ERR_FORMAT, "%s: tensor '%s': unknown dtype \"%.15s\"", what, name, dt->valuestring);
      goto done;
    }
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", dt->valuestring);
    t->ndim = cJSON_GetArraySize(shape);
    if (t->ndim > DI_ST_MAX_DIMS) {
      st = di_error_set(DI_ERR_FORMAT, "%s: tensor '%s': %d dimensions (at most %d)", what, name, t->ndim, DI_ST_MAX_DIMS);
      goto done;
    }
    /* element count with overflow checks */
    unsigned __int128 count = 1;
    int k = 0;
    for (const cJSON *d = shape->child; d; d = d->next, k++) {
      if (!di_json_int_in(d, 0, 9.0e15, &t->shape[k])) {
        st = di_error_set(DI_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer", what, name, k);
        goto done;
      }
      count *= (unsigned __int128)t->shape[k];
      if (count > ((unsigned __int128)1 << 62)) {
        st = di_error_set(DI_ERR_FORMAT, "%s: tensor '%s': shape too large", what, name);
        goto done;
      }
    }
    /* offsets past 2^53 are not exact doubles, and no file has them; the data length check follows */
    const cJSON *ob = cJSON_GetArrayItem(offs, 0), *oe = cJSON_GetArrayItem(offs, 1);
    int64_t begin, end;
    if (!di_json_int_in(ob, 0, DI_JSON_MAX_EXACT_INT, &begin) ||
        !di_json_int_in(oe, (double)begin, DI_JSON_MAX_EXACT_INT, &end)) {
      st = di_error_set(DI_ERR_FORMAT, "%s: tensor '%s': data_offsets must be integers with 0 <= begin <= end", what, name);
      goto done;
    }
    uint64_t ub = (uint64_t)begin, ue = (uint64_t)end;
    if (ue > data_len) {
      st = di_error_set(DI_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the data (%zu bytes; truncated file?)",
                        what, name, (unsigned long long)ub, (unsigned long long)ue, data_len);
      goto done;
    }
    if ((unsigned __int128)(ue - ub) != count * elem) {
      st = di_error_set(DI_ERR_FORMAT, "%s: tensor '%s': %llu bytes for %s shape of %llu elements (expected %llu)", what, name,
                        (unsigned long long)(ue - ub), t->dtype_name, (unsigned long long)count,
                        (unsigned long long)(count * elem));
      goto done;
    }
    t->name = strdup(name);
    if (!t->name) {
      st = di_error_set(DI_ERR_OOM, "%s: out of memory", what);
      goto done;
    }
    t->data = data + ub;
    t->nbytes = (size_t)(ue - ub);
    out->n_tensors++;
  }
  /* overlapping tensors: sort a copy by offset and compare neighbours */
  if (out->n_tensors > 1) {
    di_st_tensor *tmp = malloc(sizeof(di_st_tensor) * (size_t)out->n_tensors);
    if (!tmp) {
      st = di_error_set(DI_ERR_OOM, "%s: out of memory", what);
      goto done;
    }
    memcpy(tmp, out->tensors, sizeof(di_st_tensor) * (size_t)out->n_tensors);
    qsort(tmp, (size_t)out->n_tensors, sizeof *tmp, cmp_by_offset);
    for (int i = 1; i < out->n_tensors; i++) {
      const char *prev_end = (const char *)tmp[i - 1].data + tmp[i - 1].nbytes;
      if ((const char *)tmp[i].data < prev_end) {
        st = di_error_set(DI_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap in the data section", what, tmp[i - 1].name,
                          tmp[i].name);
        break;
      }
    }
    free(tmp);
  }
done:
  cJSON_Delete(root);
  if (st != DI_OK)
    di_st_file_close(out);
  return st;
}

di_status di_st_open(const char *path, di_st_file *out) {
  memset(out, 0, sizeof *out);
  int fd = open(path, O_RDONLY);
  if (fd < 0)
    return di_error_set(errno == ENOENT ? DI_ERR_NOT_FOUND : DI_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    close(fd);
    return di_error_set(DI_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
  }
  size_t len = (size_t)sb.st_size;
  void *map = NULL;
  if (len > 0) {
    map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      close(fd);
      return di_error_set(DI_ERR_IO, "cannot map %s: %s", path, strerror(errno));
    }
  }
  close(fd);
  static const uint8_t empty[1];
  di_status st = di_st_parse(map ? map : empty, len, path, out);
  if (st != DI_OK) {
    if (map)
      munmap(map, len);
    return st;
  }
  out->map = map;
  out->map_len = len;
  out->owns_map = map != NULL;
  out->path = strdup(path);
  for (int i = 0; i < out->n_tensors; i++)
    out->tensors[i].file = out->path;
  return DI_OK;
}

/* ---- multi-file source with a name hash ------------------------------------------------------ */

struct di_tensor_source {
  char *dir;
  di_st_file *files;
  int n_files;
  const di_st_tensor **slots; /* open addressing, power of two */
  size_t n_slots;
  int count;
  char desc[512];
};

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  while (*s)
    h = (h ^ (uint8_t)*s++) * 1099511628211ull;
  return h;
}

const di_st_tensor *di_tensor_source_find(const di_tensor_source *s, const char *name) {
  if (!s || !s->n_slots)
    return NULL;
  size_t mask = s->n_slots - 1;
  for (size_t i = hash_str(name) & mask;; i = (i + 1) & mask) {
    const di_st_tensor *t = s->slots[i];
    if (!t)
      return NULL;
    if (strcmp(t->name, name) == 0)
      return t;
  }
}

int di_tensor_source_count(const di_tensor_source *s) { return s ? s->count : 0; }
const char *di_tensor_source_describe(const di_tensor_source *s) { return s ? s->desc : ""; }

void di_tensor_source_free(di_tensor_source *s) {
  if (!s)
    return;
  for (int i = 0; i < s->n_files; i++)
    di_st_file_close(&s->files[i]);
  free(s->files);
  free(s->slots);
  free(s->dir);
  free(s);
}

static di_status add_file(di_tensor_source *s, const char *path) {
  di_st_file *nf = realloc(s->files, sizeof(di_st_file) * (size_t)(s->n_files + 1));
  if (!nf)
    return di_error_set(DI_ERR_OOM, "out of memory");
  s->files = nf;
  DI_TRY(di_st_open(path, &s->files[s->n_files]));
  s->n_files++;
  return DI_OK;
}

static di_status build_index(di_tensor_source *s) {
  int total = 0;
  for (int f = 0; f < s->n_files; f++)
    total += s->files[f].n_tensors;
  size_t n = 16;
  while (n < (size_t)total * 2)
    n <<= 1;
  s->slots = calloc(n, sizeof *s->slots);
  if (!s->slots)
    return di_error_set(DI_ERR_OOM, "out of memory");
  s->n_slots = n;
  for (int f = 0; f < s->n_files; f++)
    for (int i = 0; i < s->files[f].n_tensors; i++) {
      const di_st_tensor *t = &s->files[f].tensors[i];
      size_t mask = n - 1, k = hash_str(t->name) & mask;
      while (s->slots[k]) {
        if (strcmp(s->slots[k]->name, t->name) == 0)
          return di_error_set(DI_ERR_FORMAT, "tensor '%s' appears twice (%s and %s)", t->name, s->slots[k]->file, t->file);
        k = (k + 1) & mask;
      }
      s->slots[k] = t;
      s->count++;
    }
  return DI_OK;
}

static int file_exists(const char *p) { return access(p, R_OK) == 0; }

di_status di_tensor_source_open(const char *dir, di_tensor_source **out) {
  di_tensor_source *s = calloc(1, sizeof *s);
  if (!s)
    return di_error_set(DI_ERR_OOM, "out of memory");
  s->dir = strdup(dir);
  char path[4096];
  di_status st = DI_OK;
  cJSON *index = NULL;
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  if (file_exists(path)) {
    st = di_json_read_file(path, &index);
    if (st != DI_OK)
      goto fail;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
    if (!cJSON_IsObject(wm)) {
      st = di_error_set(DI_ERR_FORMAT, "%s: no \"weight_map\" object", path);
      goto fail;
    }
    /* open each distinct shard once, in order of first mention */
    for (const cJSON *e = wm->child; e; e = e->next) {
      if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || strcmp(e->valuestring, "..") == 0) {
        st = di_error_set(DI_ERR_FORMAT, "%s: weight_map entry for '%s' is not a file name in the folder", path, e->string);
        goto fail;
      }
      int seen = 0;
      char shard[4096];
      snprintf(shard, sizeof shard, "%s/%s", dir, e->valuestring);
      for (int f = 0; f < s->n_files && !seen; f++)
        seen = strcmp(s->files[f].path, shard) == 0;
      if (!seen && (st = add_file(s, shard)) != DI_OK)
        goto fail;
    }
    if ((st = build_index(s)) != DI_OK)
      goto fail;
    /* every tensor the index names must be in the shard it names */
    for (const cJSON *e = wm->child; e; e = e->next) {
      const di_st_tensor *t = di_tensor_source_find(s, e->string);
      char shard[4096];
      snprintf(shard, sizeof shard, "%s/%s", dir, e->valuestring);
      if (!t) {
        st = di_error_set(DI_ERR_NOT_FOUND, "tensor '%s' listed in %s is missing from %s", e->string, path, shard);
        goto fail;
      }
      if (strcmp(t->file, shard) != 0) {
        st = di_error_set(DI_ERR_FORMAT, "tensor '%s' is in %s but the index says %s", e->string, t->file, shard);
        goto fail;
      }
    }
  } else {
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!file_exists(path)) {
      st = di_error_set(DI_ERR_NOT_FOUND, "%s: no model.safetensors or model.safetensors.index.json (use --load-format dummy for random weights)", dir);
      goto fail;
    }
    if ((st = add_file(s, path)) != DI_OK || (st = build_index(s)) != DI_OK)
      goto fail;
  }
  snprintf(s->desc, sizeof s->desc, "%s (%d file%s, %d tensors)", dir, s->n_files, s->n_files == 1 ? "" : "s", s->count);
  cJSON_Delete(index);
  *out = s;
  return DI_OK;
fail:
  cJSON_Delete(index);
  di_tensor_source_free(s);
  return st;
}

/* The scale tensor of a quantized weight `name`, under either naming in use: transformers'
 * `<name>_scale_inv` (DeepSeek-V3 on the hub) or DeepSeek's own `<stem>.scale` for `<stem>.weight`
 * (V4 checkpoints). Writes the name looked for last into sname (for the error). */
static const di_st_tensor *find_scale(const di_tensor_source *s, const char *name, char *sname, size_t cap) {
  snprintf(sname, cap, "%s_scale_inv", name);
  const di_st_tensor *sc = di_tensor_source_find(s, sname);
  const size_t n = strlen(name);
  if (!sc && n > 7 && strcmp(name + n - 7, ".weight") == 0) {
    snprintf(sname, cap, "%.*s.scale", (int)(n - 7), name);
    sc = di_tensor_source_find(s, sname);
  }
  return sc;
}

/* The view of tensor t as stored (dtype dt, rows x cols), without scales. */
static void plain_view(const di_st_tensor *t, di_dtype dt, int64_t rows, int64_t cols, di_weight *out) {
  memset(out, 0, sizeof *out);
  out->name = t->name;
  out->dtype = dt;
  out->rows = rows;
  out->cols = cols;
  out->data = t->data;
}

/* Block scales sc (F32 or E8M0 bytes, read as stored) of br x bc blocks, scn per row of blocks. */
static void set_scales(di_weight *out, const di_st_tensor *sc, int br, int bc, int64_t scn) {
  if (sc->dtype == DI_DT_E8M0) /* UE8M0 scales (V3.2 / V4 checkpoints, MXFP4) */
    out->scale_e8m0 = sc->data;
  else
    out->scale_inv = sc->data;
  out->block_rows = br;
  out->block_cols = bc;
  out->scale_cols = scn;
}

/* MXFP4 as checkpoints store it: e2m1 pairs in I8 / U8 bytes [rows][cols / 2] (the first value of a
 * pair in the low nibble) with one E8M0 scale per 32 values [rows][cols / 32]. */
static di_status bind_mxfp4(const di_tensor_source *s, const di_st_tensor *t, const char *name, int64_t rows, int64_t cols,
                            di_weight *out) {
  char sname[1024];
  const di_st_tensor *sc = find_scale(s, name, sname, sizeof sname);
  if (!sc)
    return di_error_set(DI_ERR_NOT_FOUND, "missing tensor '%s' (E8M0 scales of the MXFP4 tensor '%s') in %s", sname, name, s->desc);
  const int64_t scn = (cols + 31) / 32;
  if (sc->dtype != DI_DT_E8M0 || sc->ndim != 2 || sc->shape[0] != rows || sc->shape[1] != scn)
    return di_error_set(DI_ERR_FORMAT, "tensor '%s' in %s must be F8_E8M0 [%lld, %lld] (one scale per 32 values of '%s')", sname,
                        sc->file, (long long)rows, (long long)scn, name);
  plain_view(t, DI_DT_F4E2M1, rows, cols, out);
  set_scales(out, sc, 1, 32, scn);
  return DI_OK;
}

di_status di_tensor_source_from_memory(const uint8_t *buf, size_t len, const char *what, di_tensor_source **out) {
  di_tensor_source *s = calloc(1, sizeof *s);
  if (!s)
    return di_error_set(DI_ERR_OOM, "out of memory");
  s->files = calloc(1, sizeof *s->files);
  s->dir = strdup(what);
  di_status st = !s->files || !s->dir ? di_error_set(DI_ERR_OOM, "out of memory") : di_st_parse(buf, len, what, s->files);
  if (st == DI_OK) {
    s->n_files = 1;
    st = build_index(s);
  }
  if (st != DI_OK) {
    di_tensor_source_free(s);
    return st;
  }
  snprintf(s->desc, sizeof s->desc, "%s (in memory, %d tensors)", what, s->count);
  *out = s;
  return DI_OK;
}

di_status di_tensor_source_weight(const di_tensor_source *s, const char *name, int64_t rows, int64_t cols,
                                  const int fp8_block[2], di_weight *out) {
  const di_st_tensor *t = di_tensor_source_find(s, name);
  if (!t)
    return di_error_set(DI_ERR_NOT_FOUND, "missing tensor '%s' in %s", name, s->desc);
  const int packed_bytes = t->dtype < 0 && (strcmp(t->dtype_name, "I8") == 0 || strcmp(t->dtype_name, "U8") == 0);
  if (packed_bytes && rows > 0 && cols % 2 == 0 && t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols / 2)
    return bind_mxfp4(s, t, name, rows, cols, out);
  int ok_shape = rows == 0 ? (t->ndim == 1 && t->shape[0] == cols)
                           : (t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols);
  if (!ok_shape) {
    char got[128] = "", *p = got;
    for (int i = 0; i < t->ndim && p < got + 100; i++)
      p += snprintf(p, (size_t)(got + sizeof got - p), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (rows == 0)
      return di_error_set(DI_ERR_FORMAT, "tensor '%s' in %s has shape [%s], the config implies [%lld]", name, t->file, got,
                          (long long)cols);
    return di_error_set(DI_ERR_FORMAT, "tensor '%s' in %s has shape [%s], the config implies [%lld, %lld]%s", name, t->file, got,
                        (long long)rows, (long long)cols,
                        packed_bytes ? " (or, as packed MXFP4 bytes, half as many columns)" : "");
  }
  if (t->dtype != DI_DT_F32 && t->dtype != DI_DT_BF16 && t->dtype != DI_DT_F16 && t->dtype != DI_DT_F8E4M3)
    return di_error_set(DI_ERR_UNSUPPORTED,
                        "tensor '%s' in %s has dtype %s (supported: BF16, F16, F32, F8_E4M3, and MXFP4 as I8 / U8 pairs)", name,
                        t->file, t->dtype_name);
  plain_view(t, (di_dtype)t->dtype, rows == 0 ? 1 : rows, cols, out);
  if (t->dtype == DI_DT_F8E4M3) {
    if (!fp8_block || fp8_block[0] <= 0 || fp8_block[1] <= 0)
      return di_error_set(DI_ERR_FORMAT, "tensor '%s' in %s is F8_E4M3 but config.json has no quantization_config.weight_block_size",
                          name, t->file);
    char sname[1024];
    const di_st_tensor *sc = find_scale(s, name, sname, sizeof sname);
    if (!sc && strstr(sname, "_scale_inv"))
      return di_error_set(DI_ERR_NOT_FOUND, "missing tensor '%s' (block scales of the FP8 tensor '%s') in %s", sname, name, s->desc);
    if (!sc)
      return di_error_set(DI_ERR_NOT_FOUND, "missing tensor '%s_scale_inv' or '%s' (block scales of the FP8 tensor '%s') in %s", name,
                          sname, name, s->desc);
    int64_t sr = (out->rows + fp8_block[0] - 1) / fp8_block[0], scn = (cols + fp8_block[1] - 1) / fp8_block[1];
    if ((sc->dtype != DI_DT_F32 && sc->dtype != DI_DT_E8M0) || sc->ndim != 2 || sc->shape[0] != sr || sc->shape[1] != scn)
      return di_error_set(DI_ERR_FORMAT, "tensor '%s' in %s must be F32 or F8_E8M0 [%lld, %lld] for block size %dx%d", sname,
                          sc->file, (long long)sr, (long long)scn, fp8_block[0], fp8_block[1]);
    set_scales(out, sc, fp8_block[0], fp8_block[1], scn);
  }
  return DI_OK;
}
