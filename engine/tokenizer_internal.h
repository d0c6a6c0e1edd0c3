/* Internal: the tokenizer's state, shared by tokenizer.c (load, lookups),
 * tokenizer_encode.c (partition, pre-tokeniser, BPE) and tokenizer_decode.c.
 * Not a public API. */
#ifndef TDM_TOKENIZER_INTERNAL_H
#define TDM_TOKENIZER_INTERNAL_H

#include "tokenizer.h"

/* A vocab-hash slot: the upper hash bits spare most text comparisons. */
typedef struct tk_vslot {
    uint32_t tag;
    int32_t id;
} tk_vslot;

/* Ids 0..n_vocab-1 are vocab tokens; n_vocab..n_xtok-1 are "virtual"
 * symbols: strings the merges produce or mention but the vocab lacks. */
struct tdm_tokenizer {
    int32_t n_vocab;
    int32_t n_xtok, xcap;
    char *arena;            /* [arena_cap] every string, NUL-terminated */
    size_t arena_len, arena_cap;
    uint32_t *text_off;     /* [n_xtok] stored (byte-level) text of each id, into arena */
    uint32_t *text_len;     /* [n_xtok] */
    uint32_t *piece_off;    /* [n_vocab] decoded bytes, into arena */
    uint32_t *piece_len;    /* [n_vocab] */
    uint8_t *type;          /* [n_vocab] tdm_token_type */
    uint8_t *eog;           /* [n_vocab] 1 = end of generation */
    tk_vslot *vhash;        /* [vmask+1] open addressing text -> id, id -1 = empty */
    uint32_t vmask;
    uint64_t *mkey;         /* [mmask+1] left << 32 | right, UINT64_MAX empty */
    uint32_t *mrank;        /* [mmask+1] merge rank */
    int32_t *mres;          /* [mmask+1] id of left+right */
    uint32_t mmask;
    int32_t byte_xid[256];  /* id of each byte's byte-level symbol */
    int32_t *specials;      /* [n_specials] CONTROL/USER_DEFINED/UNKNOWN, longest first */
    int32_t n_specials;
    tdm_pretok pretok;
    int32_t bos, eos, pad;
    bool add_bos, add_eos;
    size_t max_piece;
    char *chat_template;    /* NUL-terminated or NULL */
};

const char *tk_text(const tdm_tokenizer *tk, int32_t x, size_t *len);
int32_t tk_lookup(const tdm_tokenizer *tk, const char *s, size_t n);
/* Rank of merging (l, r) and the merged id, or -1 when no such merge. */
int64_t tk_merge_find(const tdm_tokenizer *tk, int32_t l, int32_t r, int32_t *res);

#endif
