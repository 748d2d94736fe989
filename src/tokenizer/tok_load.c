/* Loading tokenizer.json (+ tokenizer_config.json): the BPE vocab and merges, added tokens, and each
 * pipeline component, into the structures of tok_internal.h. Unknown component types are
 * DI_ERR_UNSUPPORTED errors that name the type; malformed input is DI_ERR_FORMAT naming the key. */
#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode.h"
#include "tokenizer/tok_json.h"
#include "util/json.h"
#include <sys/stat.h>
#include <unistd.h>

#define W "tokenizer.json"

static int access_ok(const char *path) { return access(path, R_OK) == 0; }

static const cJSON *jget(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
  return v && !cJSON_IsNull(v) ? v : NULL;
}

static char *dup_n(const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (p) {
    memcpy(p, s, n);
    p[n] = 0;
  }
  return p;
}

/* {"String": "..."} or {"Regex": "..."} */
static di_status load_pattern(const cJSON *o, const char *what, di_pattern *pat) {
  const cJSON *p = jget(o, "pattern");
  const cJSON *s = jget(p, "String"), *r = jget(p, "Regex");
  if (cJSON_IsString(s))
    return di_pattern_compile(pat, s->valuestring, strlen(s->valuestring), 1, what);
  if (cJSON_IsString(r))
    return di_pattern_compile(pat, r->valuestring, strlen(r->valuestring), 0, what);
  return di_error_set(DI_ERR_FORMAT, W ": %s: \"pattern\" must be {\"String\": ...} or {\"Regex\": ...}", what);
}

static const char *type_of(const cJSON *o) {
  const cJSON *t = jget(o, "type");
  return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* ---- normalizers ---- */
static di_status add_norm(di_tokenizer *t, di_norm nm) {
  di_norm *p = realloc(t->norms, (size_t)(t->n_norms + 1) * sizeof *p);
  if (!p)
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  t->norms = p;
  t->norms[t->n_norms++] = nm;
  return DI_OK;
}

static di_status load_normalizer(di_tokenizer *t, const cJSON *o, int depth) {
  const char *ty = type_of(o);
  if (!ty)
    return di_error_set(DI_ERR_FORMAT, W ": normalizer: missing \"type\"");
  if (depth > 16)
    return di_error_set(DI_ERR_FORMAT, W ": normalizer: Sequence nested too deeply");
  di_norm nm = {0};
  if (!strcmp(ty, "Sequence")) {
    const cJSON *l = jget(o, "normalizers"), *it;
    if (!cJSON_IsArray(l))
      return di_error_set(DI_ERR_FORMAT, W ": normalizer Sequence: \"normalizers\" must be an array");
    cJSON_ArrayForEach(it, l) DI_TRY(load_normalizer(t, it, depth + 1));
    return DI_OK;
  }
  if (!strcmp(ty, "NFC") || !strcmp(ty, "NFD") || !strcmp(ty, "NFKC") || !strcmp(ty, "NFKD")) {
    nm.kind = NORM_NF;
    nm.form = !strcmp(ty, "NFC") ? DI_NF_NFC : !strcmp(ty, "NFD") ? DI_NF_NFD : !strcmp(ty, "NFKC") ? DI_NF_NFKC : DI_NF_NFKD;
  } else if (!strcmp(ty, "Lowercase")) {
    nm.kind = NORM_LOWER;
  } else if (!strcmp(ty, "Strip")) {
    nm.kind = NORM_STRIP;
    DI_TRY(di_json_bool(o, "strip_left", 1, W ": normalizer Strip", &nm.strip_left));
    DI_TRY(di_json_bool(o, "strip_right", 1, W ": normalizer Strip", &nm.strip_right));
  } else if (!strcmp(ty, "Prepend")) {
    const char *s;
    nm.kind = NORM_PREPEND;
    DI_TRY(di_json_str(o, "prepend", NULL, W ": normalizer Prepend", &s));
    if (!s)
      return di_error_set(DI_ERR_FORMAT, W ": normalizer Prepend: missing \"prepend\"");
    nm.str_len = strlen(s);
    if (!(nm.str = dup_n(s, nm.str_len)))
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  } else if (!strcmp(ty, "Replace")) {
    const char *s;
    nm.kind = NORM_REPLACE;
    DI_TRY(di_json_str(o, "content", NULL, W ": normalizer Replace", &s));
    if (!s)
      return di_error_set(DI_ERR_FORMAT, W ": normalizer Replace: missing \"content\"");
    nm.str_len = strlen(s);
    if (!(nm.str = dup_n(s, nm.str_len)))
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
    di_status st = load_pattern(o, "normalizer Replace", &nm.pat);
    if (st != DI_OK) {
      free(nm.str);
      return st;
    }
  } else {
    return di_error_set(DI_ERR_UNSUPPORTED, W ": normalizer type \"%s\" is not supported", ty);
  }
  di_status st = add_norm(t, nm);
  if (st != DI_OK) {
    free(nm.str);
    di_pattern_free(&nm.pat);
  }
  return st;
}

/* ---- pre-tokenizers ---- */
static di_status add_pre(di_tokenizer *t, di_pre pr) {
  di_pre *p = realloc(t->pres, (size_t)(t->n_pres + 1) * sizeof *p);
  if (!p) {
    di_pattern_free(&pr.pat);
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  }
  t->pres = p;
  t->pres[t->n_pres++] = pr;
  return DI_OK;
}

static di_status load_prepend_scheme(const cJSON *o, const char *what, di_prepend *out) {
  const char *s;
  DI_TRY(di_json_str(o, "prepend_scheme", NULL, what, &s));
  if (!s) { /* legacy field */
    int aps;
    DI_TRY(di_json_bool(o, "add_prefix_space", 1, what, &aps));
    *out = aps ? PREPEND_ALWAYS : PREPEND_NEVER;
    return DI_OK;
  }
  if (!strcmp(s, "always"))
    *out = PREPEND_ALWAYS;
  else if (!strcmp(s, "never"))
    *out = PREPEND_NEVER;
  else if (!strcmp(s, "first"))
    *out = PREPEND_FIRST;
  else
    return di_error_set(DI_ERR_FORMAT, W ": %s: unknown prepend_scheme \"%s\"", what, s);
  return DI_OK;
}

static di_status load_replacement(const cJSON *o, const char *what, char *buf, size_t *len, uint32_t *cp) {
  const char *s;
  DI_TRY(di_json_str(o, "replacement", "\xE2\x96\x81", what, &s));
  size_t n = strlen(s);
  uint32_t c;
  if (n == 0 || di_utf8_decode((const unsigned char *)s, n, &c) != (int)n)
    return di_error_set(DI_ERR_FORMAT, W ": %s: \"replacement\" must be one character", what);
  if (buf)
    memcpy(buf, s, n);
  if (len)
    *len = n;
  if (cp)
    *cp = c;
  return DI_OK;
}

static di_status load_pretokenizer(di_tokenizer *t, const cJSON *o, int depth) {
  const char *ty = type_of(o);
  if (!ty)
    return di_error_set(DI_ERR_FORMAT, W ": pre_tokenizer: missing \"type\"");
  if (depth > 16)
    return di_error_set(DI_ERR_FORMAT, W ": pre_tokenizer: Sequence nested too deeply");
  di_pre pr = {0};
  if (!strcmp(ty, "Sequence")) {
    const cJSON *l = jget(o, "pretokenizers"), *it;
    if (!cJSON_IsArray(l))
      return di_error_set(DI_ERR_FORMAT, W ": pre_tokenizer Sequence: \"pretokenizers\" must be an array");
    cJSON_ArrayForEach(it, l) DI_TRY(load_pretokenizer(t, it, depth + 1));
    return DI_OK;
  }
  if (!strcmp(ty, "Split")) {
    const char *b;
    pr.kind = PRE_SPLIT;
    DI_TRY(di_json_str(o, "behavior", "Removed", W ": pre_tokenizer Split", &b));
    if (!strcmp(b, "Removed"))
      pr.behavior = BEH_REMOVED;
    else if (!strcmp(b, "Isolated"))
      pr.behavior = BEH_ISOLATED;
    else if (!strcmp(b, "MergedWithPrevious"))
      pr.behavior = BEH_MERGED_PREV;
    else if (!strcmp(b, "MergedWithNext"))
      pr.behavior = BEH_MERGED_NEXT;
    else if (!strcmp(b, "Contiguous"))
      pr.behavior = BEH_CONTIGUOUS;
    else
      return di_error_set(DI_ERR_FORMAT, W ": pre_tokenizer Split: unknown behavior \"%s\"", b);
    DI_TRY(di_json_bool(o, "invert", 0, W ": pre_tokenizer Split", &pr.invert));
    DI_TRY(load_pattern(o, "pre_tokenizer Split", &pr.pat));
    pr.has_pat = 1;
  } else if (!strcmp(ty, "ByteLevel")) {
    int use_regex;
    pr.kind = PRE_BYTELEVEL;
    DI_TRY(di_json_bool(o, "add_prefix_space", 1, W ": pre_tokenizer ByteLevel", &pr.add_prefix_space));
    DI_TRY(di_json_bool(o, "use_regex", 1, W ": pre_tokenizer ByteLevel", &use_regex));
    if (use_regex) {
      DI_TRY(di_pre_gpt2_compile(&pr.pat));
      pr.has_pat = 1;
    }
  } else if (!strcmp(ty, "Metaspace")) {
    pr.kind = PRE_METASPACE;
    DI_TRY(load_replacement(o, "pre_tokenizer Metaspace", pr.repl, &pr.repl_len, NULL));
    DI_TRY(load_prepend_scheme(o, "pre_tokenizer Metaspace", &pr.prepend));
    DI_TRY(di_json_bool(o, "split", 1, W ": pre_tokenizer Metaspace", &pr.split));
  } else if (!strcmp(ty, "Digits")) {
    int indiv;
    DI_TRY(di_json_bool(o, "individual_digits", 0, W ": pre_tokenizer Digits", &indiv));
    pr.kind = PRE_SPLIT;
    pr.behavior = BEH_ISOLATED;
    const char *re = indiv ? "\\p{N}" : "\\p{N}+";
    DI_TRY(di_pattern_compile(&pr.pat, re, strlen(re), 0, "pre_tokenizer Digits"));
    pr.has_pat = 1;
  } else if (!strcmp(ty, "Whitespace")) {
    pr.kind = PRE_SPLIT;
    pr.behavior = BEH_REMOVED;
    pr.invert = 1;
    /* HF runs this one with the Rust regex crate, whose \\w is Unicode's word class */
    const char *re = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]+|"
                     "[^\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}\\p{White_Space}]+";
    DI_TRY(di_pattern_compile(&pr.pat, re, strlen(re), 0, "pre_tokenizer Whitespace"));
    pr.has_pat = 1;
  } else if (!strcmp(ty, "WhitespaceSplit")) {
    pr.kind = PRE_WSPLIT;
  } else {
    return di_error_set(DI_ERR_UNSUPPORTED, W ": pre_tokenizer type \"%s\" is not supported", ty);
  }
  return add_pre(t, pr);
}

/* ---- decoders ---- */
static di_status add_dec(di_tokenizer *t, di_dec d) {
  di_dec *p = realloc(t->decs, (size_t)(t->n_decs + 1) * sizeof *p);
  if (!p) {
    free(d.str);
    di_pattern_free(&d.pat);
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  }
  t->decs = p;
  t->decs[t->n_decs++] = d;
  return DI_OK;
}

static di_status load_decoder(di_tokenizer *t, const cJSON *o, int depth) {
  const char *ty = type_of(o);
  if (!ty)
    return di_error_set(DI_ERR_FORMAT, W ": decoder: missing \"type\"");
  if (depth > 16)
    return di_error_set(DI_ERR_FORMAT, W ": decoder: Sequence nested too deeply");
  di_dec d = {0};
  if (!strcmp(ty, "Sequence")) {
    const cJSON *l = jget(o, "decoders"), *it;
    if (!cJSON_IsArray(l))
      return di_error_set(DI_ERR_FORMAT, W ": decoder Sequence: \"decoders\" must be an array");
    cJSON_ArrayForEach(it, l) DI_TRY(load_decoder(t, it, depth + 1));
    return DI_OK;
  }
  if (!strcmp(ty, "ByteLevel")) {
    d.kind = DEC_BYTELEVEL;
  } else if (!strcmp(ty, "Metaspace")) {
    d.kind = DEC_METASPACE;
    DI_TRY(load_replacement(o, "decoder Metaspace", NULL, NULL, &d.ch));
    DI_TRY(load_prepend_scheme(o, "decoder Metaspace", &d.prepend));
  } else if (!strcmp(ty, "Replace")) {
    const char *s;
    d.kind = DEC_REPLACE;
    DI_TRY(di_json_str(o, "content", NULL, W ": decoder Replace", &s));
    if (!s)
      return di_error_set(DI_ERR_FORMAT, W ": decoder Replace: missing \"content\"");
    DI_TRY(load_pattern(o, "decoder Replace", &d.pat));
    const cJSON *lit = jget(jget(o, "pattern"), "String");
    if (cJSON_IsString(lit)) {
      size_t ll = strlen(lit->valuestring);
      uint32_t cp;
      d.one_char = ll > 0 && di_utf8_decode((const unsigned char *)lit->valuestring, ll, &cp) == (int)ll;
    }
    d.str_len = strlen(s);
    if (!(d.str = dup_n(s, d.str_len))) {
      di_pattern_free(&d.pat);
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
    }
  } else if (!strcmp(ty, "ByteFallback")) {
    d.kind = DEC_BYTEFALLBACK;
  } else if (!strcmp(ty, "Fuse")) {
    d.kind = DEC_FUSE;
  } else if (!strcmp(ty, "Strip")) {
    const char *s;
    int64_t a, b;
    d.kind = DEC_STRIP;
    DI_TRY(di_json_str(o, "content", " ", W ": decoder Strip", &s));
    size_t n = strlen(s);
    if (n == 0 || di_utf8_decode((const unsigned char *)s, n, &d.ch) != (int)n)
      return di_error_set(DI_ERR_FORMAT, W ": decoder Strip: \"content\" must be one character");
    DI_TRY(di_json_int(o, "start", 0, W ": decoder Strip", &a));
    DI_TRY(di_json_int(o, "stop", 0, W ": decoder Strip", &b));
    if (a < 0 || b < 0 || a > 1000000 || b > 1000000)
      return di_error_set(DI_ERR_FORMAT, W ": decoder Strip: start/stop out of range");
    d.start = (int)a;
    d.stop = (int)b;
  } else {
    return di_error_set(DI_ERR_UNSUPPORTED, W ": decoder type \"%s\" is not supported", ty);
  }
  return add_dec(t, d);
}

/* ---- post-processors ---- */
static di_status push_ids(di_ivec *v, const cJSON *ids, const char *what) {
  const cJSON *it;
  if (!cJSON_IsArray(ids))
    return di_error_set(DI_ERR_FORMAT, W ": post_processor %s: \"ids\" must be an array", what);
  cJSON_ArrayForEach(it, ids) {
    int64_t id;
    if (!di_json_int_in(it, 0, 2147483647.0, &id))
      return di_error_set(DI_ERR_FORMAT, W ": post_processor %s: bad token id", what);
    if (di_ivec_push(v, (int32_t)id))
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  }
  return DI_OK;
}

static di_status load_post(di_tokenizer *t, const cJSON *o, int depth) {
  const char *ty = type_of(o);
  if (!ty)
    return di_error_set(DI_ERR_FORMAT, W ": post_processor: missing \"type\"");
  if (depth > 16)
    return di_error_set(DI_ERR_FORMAT, W ": post_processor: Sequence nested too deeply");
  if (!strcmp(ty, "Sequence")) {
    const cJSON *l = jget(o, "processors"), *it;
    if (!cJSON_IsArray(l))
      return di_error_set(DI_ERR_FORMAT, W ": post_processor Sequence: \"processors\" must be an array");
    cJSON_ArrayForEach(it, l) DI_TRY(load_post(t, it, depth + 1));
    return DI_OK;
  }
  if (!strcmp(ty, "ByteLevel"))
    return DI_OK; /* only offsets change */
  if (!strcmp(ty, "TemplateProcessing")) {
    const cJSON *single = jget(o, "single"), *specials = jget(o, "special_tokens"), *it;
    if (!cJSON_IsArray(single))
      return di_error_set(DI_ERR_FORMAT, W ": post_processor TemplateProcessing: \"single\" must be an array");
    /* the ids before the sequence are prepended; after it, appended in front of what a previous
     * processor of a Sequence added (each processor wraps the previous result) */
    di_ivec pre = {0}, post = {0};
    int seen_seq = 0;
    di_status st = DI_OK;
    cJSON_ArrayForEach(it, single) {
      const cJSON *sp = jget(it, "SpecialToken"), *sq = jget(it, "Sequence");
      if (sq) {
        seen_seq = 1;
        continue;
      }
      const cJSON *name = jget(sp, "id");
      if (!cJSON_IsString(name)) {
        st = di_error_set(DI_ERR_FORMAT, W ": post_processor TemplateProcessing: bad item in \"single\"");
        break;
      }
      const cJSON *def = jget(specials, name->valuestring);
      if (!def) {
        st = di_error_set(DI_ERR_FORMAT, W ": post_processor TemplateProcessing: special token \"%s\" is not in special_tokens",
                          name->valuestring);
        break;
      }
      st = push_ids(seen_seq ? &post : &pre, jget(def, "ids"), "TemplateProcessing");
      if (st != DI_OK)
        break;
    }
    if (st == DI_OK) {
      /* result = pre + (old prefix + seq + old suffix) + post */
      di_ivec np = {0};
      for (size_t k = 0; k < pre.len && st == DI_OK; k++)
        if (di_ivec_push(&np, pre.p[k]))
          st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
      for (size_t k = 0; k < t->post_prefix.len && st == DI_OK; k++)
        if (di_ivec_push(&np, t->post_prefix.p[k]))
          st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
      for (size_t k = 0; k < post.len && st == DI_OK; k++)
        if (di_ivec_push(&t->post_suffix, post.p[k]))
          st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
      free(t->post_prefix.p);
      t->post_prefix = np;
    }
    free(pre.p);
    free(post.p);
    return st;
  }
  if (!strcmp(ty, "BertProcessing") || !strcmp(ty, "RobertaProcessing")) {
    const cJSON *cls = jget(o, "cls"), *sep = jget(o, "sep");
    const cJSON *ci = cJSON_GetArrayItem(cls, 1), *si = cJSON_GetArrayItem(sep, 1);
    int64_t cls_id, sep_id;
    if (!di_json_int_in(ci, 0, 2147483647.0, &cls_id) || !di_json_int_in(si, 0, 2147483647.0, &sep_id))
      return di_error_set(DI_ERR_FORMAT, W ": post_processor %s: \"cls\"/\"sep\" must be [token, id]", ty);
    di_ivec np = {0};
    if (di_ivec_push(&np, (int32_t)cls_id))
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
    for (size_t k = 0; k < t->post_prefix.len; k++)
      if (di_ivec_push(&np, t->post_prefix.p[k])) {
        free(np.p);
        return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
      }
    free(t->post_prefix.p);
    t->post_prefix = np;
    if (di_ivec_push(&t->post_suffix, (int32_t)sep_id))
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
    return DI_OK;
  }
  return di_error_set(DI_ERR_UNSUPPORTED, W ": post_processor type \"%s\" is not supported", ty);
}

/* ---- model ---- */
/* Where model.vocab and model.merges lie in the tokenizer.json text (scanned, not parsed by cJSON). */
typedef struct {
  const char *vocab, *merges;
  size_t vocab_len, merges_len;
  const char *begin; /* start of the whole text, for error offsets */
} raw_model;

static di_status scan_at(di_jscan *js, const raw_model *rm, const char *p, size_t n) {
  js->begin = rm->begin;
  js->p = p;
  js->end = p + n;
  js->what = W;
  return DI_OK;
}

typedef struct { int32_t id; uint32_t off, len; } vent;

static di_status load_model(di_tokenizer *t, const cJSON *model, const cJSON *added, const raw_model *rm) {
  const char *ty = type_of(model);
  if (!model)
    return di_error_set(DI_ERR_FORMAT, W ": missing \"model\"");
  if (ty && strcmp(ty, "BPE") != 0)
    return di_error_set(DI_ERR_UNSUPPORTED, W ": model type \"%s\" is not supported (only BPE)", ty);
  if (!rm->vocab)
    return di_error_set(DI_ERR_FORMAT, W ": missing model.vocab");
  const cJSON *dropout = jget(model, "dropout"), *it;
  if (dropout && cJSON_IsNumber(dropout) && dropout->valuedouble > 0 && dropout->valuedouble < 1)
    return di_error_set(DI_ERR_UNSUPPORTED, W ": model.dropout is not supported (tokenization would be random)");
  /* vocab: strings go straight into tok_data (NUL-terminated each, so id_to_token can hand them out) */
  di_jscan js;
  scan_at(&js, rm, rm->vocab, rm->vocab_len);
  vent *ents = NULL;
  size_t nent = 0, cap = 0;
  int64_t max_id = -1;
  di_status st = di_jscan_expect(&js, '{');
  int more = st == DI_OK && !di_jscan_peek(&js, '}');
  if (st == DI_OK && !more)
    st = di_jscan_expect(&js, '}');
  while (st == DI_OK && more) {
    size_t off = t->tok_data.len;
    int64_t id;
    st = di_jscan_string(&js, &t->tok_data);
    if (st == DI_OK)
      st = di_jscan_expect(&js, ':');
    if (st == DI_OK)
      st = di_jscan_int(&js, &id);
    if (st == DI_OK && (id < 0 || id > 16777216))
      st = di_error_set(DI_ERR_FORMAT, W ": model.vocab[\"%.64s\"]: id %lld is outside [0, 2^24]", t->tok_data.p + off,
                        (long long)id);
    if (st != DI_OK)
      break;
    if (di_buf_putc(&t->tok_data, 0)) {
      st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
      break;
    }
    if (nent == cap) {
      cap = cap ? cap * 2 : 1024;
      vent *p = realloc(ents, cap * sizeof *p);
      if (!p) {
        st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
        break;
      }
      ents = p;
    }
    ents[nent++] = (vent){(int32_t)id, (uint32_t)off, (uint32_t)(t->tok_data.len - off - 1)};
    if (id > max_id)
      max_id = id;
    st = di_jscan_next(&js, '}', &more);
  }
  if (st != DI_OK) {
    free(ents);
    return st;
  }
  int64_t max_all = max_id;
  cJSON_ArrayForEach(it, added) {
    int64_t id;
    st = di_json_int(it, "id", -1, W ": added_tokens[]", &id);
    if (st == DI_OK && (id < 0 || id > 16777216))
      st = di_error_set(DI_ERR_FORMAT, W ": added_tokens[]: \"id\" must be an integer in [0, 2^24]");
    if (st != DI_OK) {
      free(ents);
      return st;
    }
    if (id > max_all)
      max_all = id;
  }
  t->n_model_ids = (int32_t)(max_id + 1);
  t->vocab_size = (int32_t)(max_all + 1);
  size_t nv = (size_t)t->vocab_size ? (size_t)t->vocab_size : 1;
  t->mtok_off = malloc(nv * sizeof *t->mtok_off);
  t->mtok_len = malloc(nv * sizeof *t->mtok_len);
  t->tok_off = malloc(nv * sizeof *t->tok_off);
  t->tok_len = malloc(nv * sizeof *t->tok_len);
  t->tok_flags = calloc(nv, 1);
  if (!t->mtok_off || !t->mtok_len || !t->tok_off || !t->tok_len || !t->tok_flags) {
    free(ents);
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  }
  for (size_t i = 0; i < nv; i++)
    t->mtok_len[i] = UINT32_MAX;
  for (size_t k = 0; k < nent; k++) { /* a later duplicate key of the same id wins */
    t->mtok_off[ents[k].id] = ents[k].off;
    t->mtok_len[ents[k].id] = ents[k].len;
  }
  free(ents);
  DI_TRY(di_strmap_build(&t->vocab, t->n_model_ids, t->mtok_off, t->mtok_len, t->tok_data.p, W ": model.vocab"));
  if (t->vocab.dups) /* a string given two ids: HF keeps the later, the other id is no token at all */
    for (int32_t i = 0; i < t->n_model_ids; i++)
      if (t->mtok_len[i] != UINT32_MAX && di_vocab_lookup(t, t->tok_data.p + t->mtok_off[i], t->mtok_len[i]) != i)
        t->mtok_len[i] = UINT32_MAX;
  for (int32_t i = 0; i < t->vocab_size; i++) {
    int used = i < t->n_model_ids && t->mtok_len[i] != UINT32_MAX;
    t->tok_off[i] = used ? t->mtok_off[i] : 0;
    t->tok_len[i] = used ? t->mtok_len[i] : 0;
    t->tok_flags[i] = (uint8_t)used;
  }
  /* options */
  const char *s;
  DI_TRY(di_json_bool(model, "ignore_merges", 0, W ": model", &t->ignore_merges));
  DI_TRY(di_json_bool(model, "byte_fallback", 0, W ": model", &t->byte_fallback));
  DI_TRY(di_json_bool(model, "fuse_unk", 0, W ": model", &t->fuse_unk));
  DI_TRY(di_json_str(model, "unk_token", NULL, W ": model", &s));
  t->unk_id = s ? di_vocab_lookup(t, s, strlen(s)) : -1;
  if (s && t->unk_id < 0)
    return di_error_set(DI_ERR_FORMAT, W ": model.unk_token \"%.64s\" is not in the vocab", s);
  DI_TRY(di_json_str(model, "continuing_subword_prefix", NULL, W ": model", &s));
  if (s && *s && !(t->prefix = dup_n(s, t->prefix_len = strlen(s))))
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  DI_TRY(di_json_str(model, "end_of_word_suffix", NULL, W ": model", &s));
  if (s && *s && !(t->suffix = dup_n(s, t->suffix_len = strlen(s))))
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  /* merges: "a b" strings or ["a", "b"] pairs; resolved to ids first, then the map is sized */
  di_ivec trip = {0};
  di_buf a = {0}, b = {0};
  uint32_t rank = 0;
  if (rm->merges) {
    scan_at(&js, rm, rm->merges, rm->merges_len);
    st = di_jscan_expect(&js, '[');
    more = st == DI_OK && !di_jscan_peek(&js, ']');
    if (st == DI_OK && !more)
      st = di_jscan_expect(&js, ']');
    while (st == DI_OK && more) {
      a.len = b.len = 0;
      const char *pa, *pb;
      size_t na, nb;
      if (di_jscan_peek(&js, '[')) {
        st = di_jscan_expect(&js, '[');
        if (st == DI_OK)
          st = di_jscan_string(&js, &a);
        if (st == DI_OK)
          st = di_jscan_expect(&js, ',');
        if (st == DI_OK)
          st = di_jscan_string(&js, &b);
        if (st == DI_OK)
          st = di_jscan_expect(&js, ']');
        pa = a.p ? a.p : "", na = a.len, pb = b.p ? b.p : "", nb = b.len;
      } else {
        st = di_jscan_string(&js, &a);
        const char *sp = st == DI_OK && a.p ? memchr(a.p, ' ', a.len) : NULL;
        if (st == DI_OK && (!sp || memchr(sp + 1, ' ', a.len - (size_t)(sp + 1 - a.p))))
          st = di_error_set(DI_ERR_FORMAT, W ": model.merges[%u]: \"%.64s\" is not two tokens separated by one space",
                            rank, a.p ? a.p : "");
        pa = a.p, na = sp ? (size_t)(sp - a.p) : 0, pb = sp ? sp + 1 : "", nb = sp ? a.len - na - 1 : 0;
      }
      int32_t m[3];
      if (st == DI_OK)
        st = di_bpe_merge_resolve(t, pa, na, pb, nb, rank, m);
      if (st == DI_OK && (di_ivec_push(&trip, m[0]) || di_ivec_push(&trip, m[1]) || di_ivec_push(&trip, m[2])))
        st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
      rank++;
      if (st == DI_OK)
        st = di_jscan_next(&js, ']', &more);
    }
  }
  if (st == DI_OK)
    st = di_bpe_merges_init(t, trip.len / 3);
  for (size_t k = 0; st == DI_OK && k < trip.len; k += 3)
    di_bpe_merge_insert(t, trip.p + k, (uint32_t)(k / 3));
  free(trip.p);
  di_buf_free(&a);
  di_buf_free(&b);
  return st;
}

static di_status load_added(di_tokenizer *t, const cJSON *added) {
  int n = cJSON_GetArraySize(added);
  t->added = calloc((size_t)(n ? n : 1), sizeof *t->added);
  if (!t->added)
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  const cJSON *it;
  cJSON_ArrayForEach(it, added) {
    di_added *a = &t->added[t->n_added];
    int64_t id;
    const char *c;
    const char *what = W ": added_tokens[]";
    DI_TRY(di_json_int(it, "id", -1, what, &id));
    DI_TRY(di_json_str(it, "content", NULL, what, &c));
    if (!c)
      return di_error_set(DI_ERR_FORMAT, W ": added_tokens[%d]: missing \"content\"", t->n_added);
    DI_TRY(di_json_bool(it, "special", 0, what, &a->special));
    DI_TRY(di_json_bool(it, "lstrip", 0, what, &a->lstrip));
    DI_TRY(di_json_bool(it, "rstrip", 0, what, &a->rstrip));
    DI_TRY(di_json_bool(it, "single_word", 0, what, &a->single_word));
    DI_TRY(di_json_bool(it, "normalized", !a->special, what, &a->normalized));
    a->id = (int32_t)id;
    a->len = strlen(c);
    if (!(a->content = dup_n(c, a->len)))
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
    t->n_added++;
    t->tok_off[id] = (uint32_t)t->tok_data.len;
    t->tok_len[id] = (uint32_t)a->len;
    t->tok_flags[id] = (uint8_t)(1 | 4 | (a->special ? 2 | 8 : 0));
    if (di_buf_append(&t->tok_data, c, a->len) || di_buf_putc(&t->tok_data, 0))
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  }
  return DI_OK;
}

/* bos_token / eos_token: a string or {"content": ...} */
static di_status config_token(const cJSON *cfg, const char *key, char **out) {
  const cJSON *v = jget(cfg, key);
  if (v && cJSON_IsObject(v))
    v = jget(v, "content");
  if (!v)
    return DI_OK;
  if (!cJSON_IsString(v))
    return di_error_set(DI_ERR_FORMAT, "tokenizer_config.json: \"%s\" must be a string or {\"content\": ...}", key);
  if (!(*out = dup_n(v->valuestring, strlen(v->valuestring))))
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  return DI_OK;
}

static di_status load_all(di_tokenizer *t, const cJSON *root, const cJSON *cfg, const raw_model *rm) {
  if (!cJSON_IsObject(root))
    return di_error_set(DI_ERR_FORMAT, W ": the top level must be an object");
  const cJSON *added = jget(root, "added_tokens");
  if (added && !cJSON_IsArray(added))
    return di_error_set(DI_ERR_FORMAT, W ": \"added_tokens\" must be an array");
  DI_TRY(load_model(t, jget(root, "model"), added, rm));
  if (added)
    DI_TRY(load_added(t, added));
  const cJSON *o;
  if ((o = jget(root, "normalizer")))
    DI_TRY(load_normalizer(t, o, 0));
  if ((o = jget(root, "pre_tokenizer")))
    DI_TRY(load_pretokenizer(t, o, 0));
  if ((o = jget(root, "decoder"))) {
    t->has_decoder = 1;
    DI_TRY(load_decoder(t, o, 0));
  }
  if ((o = jget(root, "post_processor")))
    DI_TRY(load_post(t, o, 0));
  for (size_t k = 0; k < t->post_prefix.len + t->post_suffix.len; k++) {
    int32_t id = k < t->post_prefix.len ? t->post_prefix.p[k] : t->post_suffix.p[k - t->post_prefix.len];
    if (id >= t->vocab_size)
      return di_error_set(DI_ERR_FORMAT, W ": post_processor: token id %d is outside the vocab", (int)id);
  }
  /* added tokens: lookup map, normalized forms, matchers */
  t->added_off = malloc(((size_t)t->n_added + 1) * sizeof *t->added_off);
  t->added_len = malloc(((size_t)t->n_added + 1) * sizeof *t->added_len);
  if (!t->added_off || !t->added_len)
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  for (int i = 0; i < t->n_added; i++) {
    t->added_off[i] = (uint32_t)t->added_keys.len;
    t->added_len[i] = (uint32_t)t->added[i].len;
    if (di_buf_append(&t->added_keys, t->added[i].content, t->added[i].len))
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  }
  if (di_buf_reserve(&t->added_keys, 0))
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  DI_TRY(di_strmap_build(&t->added_map, t->n_added, t->added_off, t->added_len, t->added_keys.p, W ": added_tokens"));
  for (int i = 0; i < t->n_added; i++) {
    di_added *a = &t->added[i];
    if (!a->normalized)
      continue;
    di_buf nb = {0};
    DI_TRY(di_normalize(t, a->content, a->len, &nb));
    if (!nb.p && di_buf_reserve(&nb, 0))
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
    a->norm = nb.p;
    a->norm_len = nb.len;
    /* As HF: a normalized added token decodes as its normalized form, and then is no longer found
     * among the special tokens that skip_special_tokens drops (that check compares strings). */
    if (a->norm_len != a->len || memcmp(a->norm, a->content, a->len) != 0) {
      t->tok_off[a->id] = (uint32_t)t->tok_data.len;
      t->tok_len[a->id] = (uint32_t)a->norm_len;
      t->tok_flags[a->id] &= (uint8_t)~8;
      if (di_buf_append(&t->tok_data, a->norm, a->norm_len) || di_buf_putc(&t->tok_data, 0))
        return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
    }
  }
  DI_TRY(di_trie_build(t, &t->trie_raw, 0));
  DI_TRY(di_trie_build(t, &t->trie_norm, 1));
  DI_TRY(di_bpe_build(t));
  /* tokenizer_config.json */
  t->bos_id = t->eos_id = -1;
  if (cfg) {
    if (!cJSON_IsObject(cfg))
      return di_error_set(DI_ERR_FORMAT, "tokenizer_config.json: the top level must be an object");
    DI_TRY(config_token(cfg, "bos_token", &t->bos_token));
    DI_TRY(config_token(cfg, "eos_token", &t->eos_token));
    DI_TRY(di_json_bool(cfg, "add_bos_token", 0, "tokenizer_config.json", &t->add_bos));
    DI_TRY(di_json_bool(cfg, "add_eos_token", 0, "tokenizer_config.json", &t->add_eos));
    DI_TRY(di_json_bool(cfg, "clean_up_tokenization_spaces", 0, "tokenizer_config.json", &t->clean_up));
    if (t->bos_token)
      t->bos_id = di_tokenizer_token_to_id(t, t->bos_token);
    if (t->eos_token)
      t->eos_id = di_tokenizer_token_to_id(t, t->eos_token);
  }
  return di_build_raw_bytes(t);
}

/* Adds the cJSON parse of the value at the scanner to obj under key. */
static di_status scan_small(di_jscan *js, cJSON *obj, const char *key) {
  const char *v;
  size_t n;
  DI_TRY(di_jscan_value_extent(js, &v, &n));
  cJSON *item = cJSON_ParseWithLength(v, n);
  if (!item)
    return di_error_set(DI_ERR_FORMAT, W ": invalid JSON in \"%.64s\" at byte %zu", key, (size_t)(v - js->begin));
  cJSON_DeleteItemFromObjectCaseSensitive(obj, key); /* a repeated key: the last one wins */
  if (!cJSON_AddItemToObject(obj, key, item)) { /* it copies the key: out of memory */
    cJSON_Delete(item);
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  }
  return DI_OK;
}

/* Top level of tokenizer.json: model.vocab and model.merges are located, the rest parsed. */
static di_status scan_root(const char *json, size_t len, cJSON *root, raw_model *rm) {
  di_jscan js = {json, json, json + len, W};
  di_buf key = {0};
  rm->begin = json;
  di_status st = di_jscan_expect(&js, '{');
  int more = st == DI_OK && !di_jscan_peek(&js, '}');
  if (st == DI_OK && !more)
    st = di_jscan_expect(&js, '}');
  while (st == DI_OK && more) {
    key.len = 0;
    st = di_jscan_string(&js, &key);
    if (st == DI_OK)
      st = di_jscan_expect(&js, ':');
    if (st != DI_OK)
      break;
    const char *k = key.p ? key.p : "";
    if (!strcmp(k, "model") && di_jscan_peek(&js, '{')) {
      cJSON *model = cJSON_CreateObject();
      di_buf mk = {0};
      if (!model)
        st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
      else {
        cJSON_DeleteItemFromObjectCaseSensitive(root, "model");
        if (!cJSON_AddItemToObject(root, "model", model)) {
          cJSON_Delete(model);
          st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
        }
      }
      if (st == DI_OK)
        st = di_jscan_expect(&js, '{');
      int mmore = st == DI_OK && !di_jscan_peek(&js, '}');
      if (st == DI_OK && !mmore)
        st = di_jscan_expect(&js, '}');
      while (st == DI_OK && mmore) {
        mk.len = 0;
        st = di_jscan_string(&js, &mk);
        if (st == DI_OK)
          st = di_jscan_expect(&js, ':');
        if (st != DI_OK)
          break;
        const char *m = mk.p ? mk.p : "";
        if (!strcmp(m, "vocab"))
          st = di_jscan_value_extent(&js, &rm->vocab, &rm->vocab_len);
        else if (!strcmp(m, "merges"))
          st = di_jscan_value_extent(&js, &rm->merges, &rm->merges_len);
        else
          st = scan_small(&js, model, m);
        if (st == DI_OK)
          st = di_jscan_next(&js, '}', &mmore);
      }
      di_buf_free(&mk);
    } else {
      st = scan_small(&js, root, k);
    }
    if (st == DI_OK)
      st = di_jscan_next(&js, '}', &more);
  }
  if (st == DI_OK && !di_jscan_peek(&js, ' ') && js.p < js.end) /* (peek skips whitespace) */
    st = di_error_set(DI_ERR_FORMAT, W ": unexpected text after the top-level object at byte %zu", (size_t)(js.p - json));
  di_buf_free(&key);
  return st;
}

di_status di_tokenizer_load_mem(const char *json, size_t len, const char *config_json, size_t config_len,
                                const char *what, di_tokenizer **out) {
  if (!json || !out)
    return di_error_set(DI_ERR_INVALID_ARG, "di_tokenizer_load_mem: NULL argument");
  cJSON *root = cJSON_CreateObject(), *cfg = NULL;
  raw_model rm = {0};
  di_status st = root ? scan_root(json, len, root, &rm) : di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  if (st == DI_OK && config_json)
    st = di_json_parse(config_json, config_len, "tokenizer_config.json", &cfg);
  di_tokenizer *t = NULL;
  if (st == DI_OK) {
    t = calloc(1, sizeof *t);
    st = t ? load_all(t, root, cfg, &rm) : di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  }
  if (st != DI_OK && what && strcmp(what, W) != 0) { /* name the file instead of "tokenizer.json" */
    char msg[1024];
    const char *m = di_last_error();
    snprintf(msg, sizeof msg, "%s", strncmp(m, W ": ", sizeof W + 1) == 0 ? m + sizeof W + 1 : m);
    di_error_set(st, "%s: %s", what, msg);
  }
  cJSON_Delete(root);
  cJSON_Delete(cfg);
  if (st != DI_OK) {
    di_tokenizer_free(t);
    return st;
  }
  *out = t;
  return DI_OK;
}

di_status di_tokenizer_load(const char *path, di_tokenizer **out) {
  if (!path || !out)
    return di_error_set(DI_ERR_INVALID_ARG, "di_tokenizer_load: NULL argument");
  struct stat sb;
  if (stat(path, &sb) != 0)
    return di_error_set(DI_ERR_NOT_FOUND, "tokenizer: %s does not exist", path);
  size_t pl = strlen(path);
  char *json_path = malloc(pl + 32), *cfg_path = malloc(pl + 32);
  if (!json_path || !cfg_path) {
    free(json_path);
    free(cfg_path);
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  }
  if (S_ISDIR(sb.st_mode)) {
    snprintf(json_path, pl + 32, "%s/tokenizer.json", path);
    snprintf(cfg_path, pl + 32, "%s/tokenizer_config.json", path);
  } else {
    memcpy(json_path, path, pl + 1);
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path) + 1 : 0;
    memcpy(cfg_path, path, dl);
    memcpy(cfg_path + dl, "tokenizer_config.json", sizeof "tokenizer_config.json");
  }
  char *json = NULL, *cfg = NULL;
  size_t jn = 0, cn = 0;
  di_status st = di_read_file(json_path, &json, &jn);
  if (st == DI_OK && access_ok(cfg_path))
    st = di_read_file(cfg_path, &cfg, &cn);
  if (st == DI_OK)
    st = di_tokenizer_load_mem(json, jn, cfg, cn, json_path, out);
  free(json);
  free(cfg);
  free(json_path);
  free(cfg_path);
  return st;
}

void di_tokenizer_free(di_tokenizer *t) {
  if (!t)
    return;
  di_bpe_free(t);
  free(t->tok_off);
  free(t->tok_len);
  free(t->tok_flags);
  di_buf_free(&t->tok_data);
  free(t->vocab.slots);
  free(t->added_map.slots);
  free(t->added_off);
  free(t->added_len);
  di_buf_free(&t->added_keys);
  free(t->mtok_off);
  free(t->mtok_len);
  free(t->prefix);
  free(t->suffix);
  for (int i = 0; i < t->n_norms; i++) {
    free(t->norms[i].str);
    di_pattern_free(&t->norms[i].pat);
  }
  free(t->norms);
  for (int i = 0; i < t->n_pres; i++)
    di_pattern_free(&t->pres[i].pat);
  free(t->pres);
  for (int i = 0; i < t->n_decs; i++) {
    free(t->decs[i].str);
    di_pattern_free(&t->decs[i].pat);
  }
  free(t->decs);
  free(t->post_prefix.p);
  free(t->post_suffix.p);
  for (int i = 0; i < t->n_added; i++) {
    free(t->added[i].content);
    free(t->added[i].norm);
  }
  free(t->added);
  di_trie_free(&t->trie_raw);
  di_trie_free(&t->trie_norm);
  free(t->raw_off);
  free(t->raw_len);
  di_buf_free(&t->raw_data);
  free(t->bos_token);
  free(t->eos_token);
  free(t);
}

/* ---- accessors ---- */
int di_tokenizer_vocab_size(const di_tokenizer *t) { return t ? t->vocab_size : 0; }
int di_tokenizer_is_special(const di_tokenizer *t, int32_t id) {
  return t && id >= 0 && id < t->vocab_size && (t->tok_flags[id] & 2) != 0;
}
const char *di_tokenizer_id_to_token(const di_tokenizer *t, int32_t id) {
  if (!t || id < 0 || id >= t->vocab_size || !(t->tok_flags[id] & 1))
    return NULL;
  return t->tok_data.p + t->tok_off[id]; /* NUL-terminated in tok_data */
}
int32_t di_tokenizer_token_to_id(const di_tokenizer *t, const char *token) {
  if (!t || !token)
    return -1;
  size_t n = strlen(token);
  if (t->added_map.slots && t->n_added) {
    /* keys of added_map are the added contents in order */
    int32_t k = di_strmap_get(&t->added_map, token, n, t->added_off, t->added_len, t->added_keys.p);
    if (k >= 0)
      return t->added[k].id;
  }
  return di_vocab_lookup(t, token, n);
}
int32_t di_tokenizer_bos_id(const di_tokenizer *t) { return t ? t->bos_id : -1; }
int32_t di_tokenizer_eos_id(const di_tokenizer *t) { return t ? t->eos_id : -1; }
int di_tokenizer_add_bos(const di_tokenizer *t) { return t ? t->add_bos : 0; }
int di_tokenizer_add_eos(const di_tokenizer *t) { return t ? t->add_eos : 0; }
int di_tokenizer_clean_up_spaces(const di_tokenizer *t) { return t ? t->clean_up : 0; }
const char *di_tokenizer_bos_token(const di_tokenizer *t) { return t ? t->bos_token : NULL; }
const char *di_tokenizer_eos_token(const di_tokenizer *t) { return t ? t->eos_token : NULL; }
