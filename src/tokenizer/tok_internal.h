/* Internal structures of the tokenizer shared by its files: the loaded pipeline (normalizers,
 * pre-tokenizers, BPE model, decoders, post-processor, added tokens) and the hash maps behind it.
 * Everything here is immutable after loading except the BPE word cache (mutex-guarded). */
#ifndef DI_TOKENIZER_INTERNAL_H
#define DI_TOKENIZER_INTERNAL_H
#include <pthread.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include "tokenizer/buf.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

/* ---- string -> id hash map (open addressing over ids; keys live in the owner's token table) ---- */
typedef struct {
  uint32_t tag;  /* high half of the key's hash */
  uint32_t idx;  /* key index + 1; 0 = empty */
  uint32_t off, len; /* the key's bytes, copied here so a probe touches one cache line */
} di_strslot;
typedef struct {
  di_strslot *slots;
  uint32_t mask;
  uint32_t dups; /* keys seen twice while building (the later index won) */
} di_strmap;
uint64_t di_hash_bytes(const char *s, size_t n);

/* A pattern of Split / Replace: a compiled PCRE2 regex (String patterns are compiled as literals). */
typedef struct {
  pcre2_code *re;
} di_pattern;
/* Finds all matches the way HF does over an Oniguruma regex (find_iter: leftmost, non-overlapping,
 * an empty match right after the previous match is skipped). Appends (start, end) pairs to m.
 * Returns DI_OK or an error (regex engine failure). */
typedef struct { size_t *p; size_t len, cap; } di_spans;
di_status di_pattern_find_all(const di_pattern *pat, pcre2_match_data *md, const char *s, size_t n, di_spans *m);
di_status di_pattern_compile(di_pattern *pat, const char *src, size_t n, int literal, const char *what);
void di_pattern_free(di_pattern *pat);

/* ---- normalizers ---- */
typedef enum { NORM_NF, NORM_LOWER, NORM_STRIP, NORM_PREPEND, NORM_REPLACE } di_norm_kind;
typedef struct {
  di_norm_kind kind;
  int form;                 /* NORM_NF: di_nf_form */
  int strip_left, strip_right;
  char *str;                /* PREPEND: the prefix; REPLACE: the content */
  size_t str_len;
  di_pattern pat;           /* REPLACE */
} di_norm;

/* ---- pre-tokenizers ---- */
typedef enum { PRE_SPLIT, PRE_BYTELEVEL, PRE_METASPACE, PRE_WSPLIT } di_pre_kind;
typedef enum { BEH_REMOVED, BEH_ISOLATED, BEH_MERGED_PREV, BEH_MERGED_NEXT, BEH_CONTIGUOUS } di_behavior;
typedef enum { PREPEND_ALWAYS, PREPEND_NEVER, PREPEND_FIRST } di_prepend;
typedef struct {
  di_pre_kind kind;
  di_pattern pat;           /* SPLIT (also ByteLevel's own regex when use_regex) */
  int has_pat;
  di_behavior behavior;
  int invert;
  int add_prefix_space;     /* BYTELEVEL */
  char repl[8];             /* METASPACE replacement, UTF-8 */
  size_t repl_len;
  di_prepend prepend;
  int split;
} di_pre;

/* ---- decoders ---- */
typedef enum { DEC_BYTELEVEL, DEC_METASPACE, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP } di_dec_kind;
typedef struct {
  di_dec_kind kind;
  di_pattern pat;           /* REPLACE */
  char *str;                /* REPLACE content */
  size_t str_len;
  uint32_t ch;              /* METASPACE replacement / STRIP content (a code point) */
  di_prepend prepend;
  int start, stop;          /* STRIP */
  int one_char;             /* REPLACE: the pattern is one literal character (never spans tokens) */
} di_dec;

typedef struct {
  char *content;
  size_t len;
  int32_t id;
  int special, lstrip, rstrip, single_word, normalized;
  char *norm;               /* content after the normalizer (what normalized tokens match) */
  size_t norm_len;
} di_added;

/* Matcher of added tokens: leftmost-longest over a byte trie, as HF's Aho-Corasick. */
typedef struct {
  void *edges;              /* (node, byte) -> child node hash map (tok_encode.c) */
  int32_t *term;            /* node -> added-token index or -1 */
  int32_t n_nodes;
  uint8_t first[256];       /* bytes that start some pattern */
  int empty;                /* no patterns */
} di_trie;

typedef struct { uint32_t rank; int32_t new_id; } di_merge_val;
typedef struct {
  uint64_t *keys;           /* (a << 32 | b) + 1; 0 = empty */
  di_merge_val *vals;
  uint64_t mask;
} di_merge_map;

/* BPE word cache: piece string -> ids (shared, mutex-guarded, reset when full). */
typedef struct {
  pthread_mutex_t mu;
  uint32_t *slots;          /* 0 empty, else entry index + 1 */
  uint32_t mask;
  uint32_t count, limit;
  di_buf keys;              /* concatenated key bytes */
  di_ivec vals;             /* per entry: key_off, key_len, n_ids, ids... */
} di_bpe_cache;

struct di_tokenizer {
  /* token table: id -> string (model vocab, overridden by added tokens) */
  int32_t vocab_size;
  uint32_t *tok_off, *tok_len;
  uint8_t *tok_flags;       /* 1: used, 2: special, 4: added, 8: dropped by skip_special_tokens,
                               16: a ByteFallback <0xXX> token */
  di_buf tok_data;
  /* model vocab only (BPE lookups): map over ids of the model */
  di_strmap vocab;
  uint32_t *mtok_off, *mtok_len; /* model vocab strings, indexed by id */
  int32_t n_model_ids;      /* max model id + 1 */
  di_strmap added_map;      /* token string -> added index */
  uint32_t *added_off, *added_len; /* keys of added_map in added_keys */
  di_buf added_keys;
  int32_t char_id[0x400];   /* model id of single code points below U+0400 (-1 none) */
  /* BPE model */
  di_merge_map merges;
  int32_t merge_guess;      /* loader: new_id - rank of the last merge (ids often follow ranks) */
  int ignore_merges, byte_fallback, fuse_unk;
  int32_t unk_id;
  char *prefix, *suffix;    /* continuing_subword_prefix / end_of_word_suffix (NULL or "") */
  size_t prefix_len, suffix_len;
  int32_t byte_id[256];     /* <0xXX> tokens for byte fallback (-1 none) */
  di_bpe_cache *cache;
  /* pipeline */
  di_norm *norms;
  int n_norms;
  di_pre *pres;
  int n_pres;
  di_dec *decs;
  int n_decs;
  int has_decoder;
  di_ivec post_prefix, post_suffix; /* ids the post-processor adds around a single sequence */
  di_added *added;
  int n_added;
  di_trie trie_raw, trie_norm; /* non-normalized / normalized added tokens */
  /* raw bytes per id (token_bytes) */
  uint32_t *raw_off, *raw_len;
  di_buf raw_data;
  /* tokenizer_config.json */
  char *bos_token, *eos_token;
  int32_t bos_id, eos_id;
  int add_bos, add_eos, clean_up;
};

/* tok_bpe.c */
di_status di_bpe_build(di_tokenizer *t);
/* Appends the ids of one pre-tokenized piece. */
di_status di_bpe_encode_word(const di_tokenizer *t, const char *w, size_t n, di_ivec *out);
void di_bpe_free(di_tokenizer *t);
di_status di_bpe_merges_init(di_tokenizer *t, size_t n);
/* Ids of a merge's two tokens and of their concatenation (out[0..2]); errors name the merge. */
di_status di_bpe_merge_resolve(di_tokenizer *t, const char *a, size_t na, const char *b, size_t nb,
                               uint32_t rank, int32_t out[3]);
void di_bpe_merge_insert(di_tokenizer *t, const int32_t m[3], uint32_t rank);
int32_t di_vocab_lookup(const di_tokenizer *t, const char *s, size_t n);
int32_t di_strmap_get(const di_strmap *m, const char *s, size_t n, const uint32_t *off, const uint32_t *len,
                      const char *data);
di_status di_strmap_build(di_strmap *m, int32_t n_keys, const uint32_t *off, const uint32_t *len,
                          const char *data, const char *what);
/* tok_encode.c */
di_status di_trie_build(di_tokenizer *t, di_trie *tr, int want_norm);
void di_trie_free(di_trie *tr);
/* tok_decode.c */
di_status di_decode_tokens(const di_tokenizer *t, const int32_t *ids, size_t n, int skip_special, di_buf *out);
void di_cleanup_spaces(di_buf *b);
di_status di_build_raw_bytes(di_tokenizer *t);
/* the GPT-2 byte <-> unicode map of ByteLevel */
extern const uint16_t di_byte_to_cp[256];
int di_cp_to_byte(uint32_t cp); /* -1 if cp is not in the map */
/* tok_pre.c */
di_status di_normalize(const di_tokenizer *t, const char *s, size_t n, di_buf *out);
di_status di_pretokenize_encode(const di_tokenizer *t, const char *s, size_t n, int at_start, di_ivec *ids,
                                void *scratch);
void *di_pre_scratch_new(void);
di_status di_pre_gpt2_compile(di_pattern *pat); /* ByteLevel's own regex */
void di_pre_scratch_free(void *scratch);
#endif
