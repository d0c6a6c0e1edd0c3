/* tokenizer: byte-level BPE built from a GGUF's tokenizer.ggml.* metadata
 * (gguf.md §4), with the qwen2 / qwen35 pre-tokenisers (gpt2 as fallback).
 *
 * Ownership and threads: tdm_tokenizer_load() copies everything it needs out
 * of the GGUF (the tokenizer may outlive the tdm_gguf). After load the
 * tokenizer is immutable, so any number of threads may encode/decode with it
 * at once. Every pointer it hands out lives until tdm_tokenizer_free().
 *
 * Encoding (per request, not per token) allocates scratch proportional to the
 * input and frees it before returning. Decoding and the streaming
 * detokeniser (tdm_detok, embeddable, no allocation) never allocate.
 *
 * Invalid UTF-8: before pre-tokenisation every byte that is not part of a
 * well-formed UTF-8 sequence (RFC 3629: no overlongs, no surrogates, nothing
 * above U+10FFFF) is replaced by U+FFFD, one per bad byte (llama.cpp replaces
 * per byte too). So decode(encode(x)) == tdm_utf8_sanitize(x) (unicode.h);
 * for valid UTF-8, decode(encode(x)) == x.
 */
#ifndef TDM_TOKENIZER_H
#define TDM_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "status.h"

typedef struct tdm_tokenizer tdm_tokenizer;

/* tokenizer.ggml.token_type values. */
typedef enum tdm_token_type {
    TDM_TOKEN_UNDEFINED = 0,
    TDM_TOKEN_NORMAL = 1,
    TDM_TOKEN_UNKNOWN = 2,
    TDM_TOKEN_CONTROL = 3,      /* <|im_start|>: split out only with TDM_TOKENIZE_PARSE_SPECIAL */
    TDM_TOKEN_USER_DEFINED = 4, /* <think> in real Qwen files: always split out */
    TDM_TOKEN_UNUSED = 5,       /* [PAD..]: never produced by encode, decodes to nothing */
    TDM_TOKEN_BYTE = 6
} tdm_token_type;

typedef enum tdm_pretok {
    TDM_PRETOK_GPT2 = 0, /* "gpt2", or key absent (warned) */
    TDM_PRETOK_QWEN2,    /* "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2" */
    TDM_PRETOK_QWEN35    /* "qwen35" */
} tdm_pretok;

/* encode flags */
#define TDM_TOKENIZE_PARSE_SPECIAL 1u /* split out CONTROL/UNKNOWN tokens too (chat prompts) */
#define TDM_TOKENIZE_ADD_SPECIAL 2u   /* prepend BOS / append EOS when the file asks (never for Qwen) */
/* decode flags */
#define TDM_DECODE_SPECIAL 1u /* CONTROL/UNKNOWN tokens produce their text (else nothing) */

/* Builds the tokenizer (vocab hash + merge-rank hash) from g. Requires
 * tokenizer.ggml.model == "gpt2", tokens, merges; token_type optional
 * (all NORMAL). Errors: TDM_ERR_FORMAT (malformed/missing key, named),
 * TDM_ERR_UNSUPPORTED (other tokenizer model or unknown pre string),
 * TDM_ERR_OOM. On failure *out is NULL. */
tdm_status tdm_tokenizer_load(const tdm_gguf *g, tdm_tokenizer **out, tdm_error *err);
/* Convenience: opens path, loads, closes the GGUF. */
tdm_status tdm_tokenizer_open(const char *gguf_path, tdm_tokenizer **out, tdm_error *err);
void tdm_tokenizer_free(tdm_tokenizer *tk);

int32_t tdm_tokenizer_n_vocab(const tdm_tokenizer *tk);
tdm_pretok tdm_tokenizer_pretok(const tdm_tokenizer *tk);
/* Special ids from the metadata, -1 when absent or out of range. */
int32_t tdm_tokenizer_bos(const tdm_tokenizer *tk);
int32_t tdm_tokenizer_eos(const tdm_tokenizer *tk);
int32_t tdm_tokenizer_pad(const tdm_tokenizer *tk);
bool tdm_tokenizer_add_bos(const tdm_tokenizer *tk);

/* Id of the token whose stored text is exactly `text` (NUL-terminated), or
 * -1. Specials match literally ("<think>"); normal tokens are stored
 * byte-level encoded ("Ġthe"). */
int32_t tdm_tokenizer_find(const tdm_tokenizer *tk, const char *text);
/* End of generation: eos, eot, <|im_end|>, <|endoftext|>, fim pad/repo/sep... (gguf.md §4.2). */
bool tdm_tokenizer_is_eog(const tdm_tokenizer *tk, int32_t id);
/* TDM_TOKEN_UNDEFINED for an id out of range. */
tdm_token_type tdm_tokenizer_token_type(const tdm_tokenizer *tk, int32_t id);
/* The stored vocab text (NUL-terminated), NULL for an id out of range. */
const char *tdm_tokenizer_token_text(const tdm_tokenizer *tk, int32_t id, size_t *len);
/* The bytes the token decodes to (NUL-terminated; may be a partial UTF-8
 * sequence; CONTROL/USER_DEFINED: their text; UNUSED/BYTE: ""). NULL for an
 * id out of range. Note: CONTROL pieces are returned even though decode
 * without TDM_DECODE_SPECIAL drops them. */
const char *tdm_tokenizer_piece(const tdm_tokenizer *tk, int32_t id, size_t *len);
size_t tdm_tokenizer_max_piece_len(const tdm_tokenizer *tk);
/* tokenizer.chat_template (NUL-terminated) or NULL when the file has none. */
const char *tdm_tokenizer_chat_template(const tdm_tokenizer *tk);

/* Upper bound of the ids encode produces for len bytes of text (+ BOS/EOS). */
static inline size_t tdm_tokenizer_encode_bound(size_t len) { return 3 * len + 2; }

/* Encodes text[0..len) (need not be NUL-terminated nor valid UTF-8).
 * Writes at most cap ids; *n_ids = the number of ids of the full result.
 * When that exceeds cap: TDM_ERR_INVALID (ids holds the first cap), so
 * `ids=NULL, cap=0` measures. cap >= tdm_tokenizer_encode_bound(len) always
 * suffices. */
tdm_status tdm_tokenizer_encode(const tdm_tokenizer *tk, const char *text, size_t len, unsigned flags,
                                int32_t *ids, size_t cap, size_t *n_ids, tdm_error *err);

/* Concatenates the pieces of ids (raw bytes, no UTF-8 repair) into out and
 * NUL-terminates. *len = bytes of the full text (without the NUL); when
 * *len + 1 > cap: TDM_ERR_INVALID and out holds a NUL-terminated prefix.
 * An id out of range: TDM_ERR_INVALID naming it. */
tdm_status tdm_tokenizer_decode(const tdm_tokenizer *tk, const int32_t *ids, size_t n, unsigned flags,
                                char *out, size_t cap, size_t *len, tdm_error *err);

/* ---- streaming detokeniser: emits only complete, valid UTF-8 ----
 * Holds back the bytes of a code point split across tokens; bytes that can
 * never form a valid sequence are emitted as U+FFFD (one per byte).
 * Plain struct: embed it, no allocation, no free. */
typedef struct tdm_detok {
    uint8_t pending[4]; /* [n_pending] bytes of an incomplete code point */
    uint32_t n_pending;
    unsigned flags;     /* TDM_DECODE_SPECIAL or 0 */
} tdm_detok;

#define TDM_DETOK_FLUSH_MAX 9 /* bytes tdm_detok_flush() may write at most */

void tdm_detok_init(tdm_detok *d, unsigned flags);
/* Output bytes one tdm_detok_push() may need at most (for sizing buffers once). */
size_t tdm_detok_cap(const tdm_tokenizer *tk);
/* Appends the valid UTF-8 completed by token id to out (*len bytes, not
 * NUL-terminated; may be 0). TDM_ERR_INVALID for an id out of range or
 * cap < tdm_detok_cap(tk) (d unchanged). */
tdm_status tdm_detok_push(tdm_detok *d, const tdm_tokenizer *tk, int32_t id, char *out, size_t cap,
                          size_t *len, tdm_error *err);
/* End of stream: emits U+FFFD for each held-back byte; returns the bytes
 * written (out must hold TDM_DETOK_FLUSH_MAX). Leaves d reset. */
size_t tdm_detok_flush(tdm_detok *d, char *out);

#endif
