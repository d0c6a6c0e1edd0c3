/* generate: the request-level generation driver on top of a session, the
 * tokenizer, the chat template and the sampler.
 *
 * One call serves one request: it renders the chat (or takes a raw prompt),
 * tokenises it, reuses the prefix the session already holds from the previous
 * request (tdm_session_truncate to the common prefix, evaluate only the
 * rest), then samples until an end-of-generation token, a stop string, the
 * token cap or the context end. Along the way it
 *  - splits the output into a thinking part (between <think> and </think>)
 *    and the answer, and forces "</think>\n\n" once max_thinking_tokens
 *    thinking tokens were sampled;
 *  - when max_tokens cuts an answer mid-sentence, samples up to grace_tokens
 *    more to reach a sentence end (. ! ? or a newline);
 *  - holds back text that may be the start of a stop string or of a UTF-8
 *    character, so every piece handed to on_text is valid UTF-8 and final;
 *  - closes an unclosed ``` fence of the answer with a last piece.
 *
 * Ownership: the generator borrows the model (which must outlive it) and owns
 * one session, the tokenizer, the sampler and every buffer, all sized in
 * tdm_generator_new(); a run allocates nothing per token. One thread at a time.
 */
#ifndef TDM_GENERATE_H
#define TDM_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "session.h"
#include "status.h"

#define TDM_GEN_STOP_MAX 16        /* stop strings per request */
#define TDM_GEN_STOP_LEN_MAX 256   /* bytes per stop string */
#define TDM_GEN_GRACE_DEFAULT 64

typedef struct tdm_generator tdm_generator;

typedef struct tdm_gen_message {
    const char *role;      /* "system", "user" or "assistant" (NUL-terminated) */
    const char *content;   /* UTF-8, NUL-terminated; "" allowed */
    const char *reasoning; /* assistant thinking to render, or NULL */
} tdm_gen_message;

typedef enum tdm_gen_thinking {
    TDM_GEN_THINK_DEFAULT = 0, /* whatever the chat template does by default */
    TDM_GEN_THINK_ON,
    TDM_GEN_THINK_OFF
} tdm_gen_thinking;

typedef struct tdm_gen_params {
    int32_t max_tokens;          /* cap on sampled tokens (thinking + answer); <= 0: none */
    int32_t max_thinking_tokens; /* thinking tokens before </think> is forced; < 0: none */
    int32_t grace_tokens;        /* extra tokens to finish a sentence cut by max_tokens */
    float temperature;           /* <= 0: greedy */
    float top_p;                 /* 1: off */
    float min_p;                 /* 0: off */
    int32_t top_k;               /* 0: off */
    float repeat_penalty;        /* 1: off */
    float frequency_penalty;     /* 0: off (OpenAI's, over the generated tokens) */
    float presence_penalty;      /* 0: off */
    uint64_t seed;
    const char *const *stop;     /* stop strings (borrowed), matched on the answer */
    int32_t n_stop;              /* <= TDM_GEN_STOP_MAX, each 1..TDM_GEN_STOP_LEN_MAX bytes */
    bool repair_fences;          /* close an unclosed ``` fence at the end */
    bool ignore_eog;             /* never sample an end-of-generation token (benchmarks, tests) */
} tdm_gen_params;

/* Defaults: no caps, grace 64, temperature 0.8, top_p 0.95, top_k 40,
 * min_p 0.05, no penalties, seed 0, no stop strings, fence repair on. */
void tdm_gen_params_default(tdm_gen_params *p);

typedef enum tdm_gen_part { TDM_GEN_ANSWER = 0, TDM_GEN_THINKING = 1 } tdm_gen_part;

typedef enum tdm_gen_finish {
    TDM_GEN_FINISH_EOG = 0,    /* the model ended its turn */
    TDM_GEN_FINISH_STOP,       /* a stop string matched (it is not emitted) */
    TDM_GEN_FINISH_LENGTH,     /* max_tokens (+ grace) reached */
    TDM_GEN_FINISH_CONTEXT,    /* the session's context is full */
    TDM_GEN_FINISH_CANCELLED   /* callbacks.cancelled() said so */
} tdm_gen_finish;

const char *tdm_gen_finish_name(tdm_gen_finish f); /* "eog", "stop", ... */

typedef struct tdm_gen_callbacks {
    /* After tokenising, before evaluating the prompt (may be NULL). */
    void (*on_prompt)(void *user, int32_t n_prompt, int32_t n_reused);
    /* Final text pieces, valid UTF-8, in order (may be NULL). */
    void (*on_text)(void *user, tdm_gen_part part, const char *text, size_t len);
    /* Polled before every token; true ends the run (may be NULL). */
    bool (*cancelled)(void *user);
    void *user;
} tdm_gen_callbacks;

typedef struct tdm_gen_result {
    tdm_gen_finish finish;
    int32_t stop_index;      /* index of the matched stop string, else -1 */
    int32_t n_prompt;        /* prompt tokens */
    int32_t n_reused;        /* of which the session already held */
    int32_t n_generated;     /* tokens appended after the prompt (incl. forced </think>) */
    int32_t n_thinking;      /* of which in the thinking part */
    bool thinking_forced;    /* the thinking budget inserted </think> */
    bool fence_closed;       /* a closing fence was appended */
    double prompt_seconds;   /* tokenising + prompt evaluation */
    double gen_seconds;      /* sampling loop */
} tdm_gen_result;

/* n_ctx: the session's context (prompt + generated); <= 0 picks
 * min(n_ctx_train, 4096). dev: where the forward runs (session.h; AUTO =
 * the GPU when one is visible). */
tdm_status tdm_generator_new(tdm_model *m, int32_t n_ctx, tdm_device dev, tdm_generator **out, tdm_error *err);
/* The same on a session made by the caller (e.g. a hybrid one, session.h),
 * which the generator owns from now on (freed on failure too). */
tdm_status tdm_generator_new_session(tdm_model *m, tdm_session *sess, tdm_generator **out, tdm_error *err);
/* The context tdm_generator_new picks for n_ctx <= 0. */
int32_t tdm_generator_default_ctx(const tdm_model *m);
void tdm_generator_free(tdm_generator *g);
int32_t tdm_generator_n_ctx(const tdm_generator *g);

/* Renders messages with the model's chat template (generation prompt added)
 * and generates. TDM_ERR_INVALID when the request cannot be served (prompt
 * longer than the context, bad role, bad stop string); other codes are
 * engine failures. res is filled on TDM_OK. */
tdm_status tdm_generator_chat(tdm_generator *g, const tdm_gen_message *msgs, int32_t n_msgs,
                              tdm_gen_thinking thinking, const tdm_gen_params *p,
                              const tdm_gen_callbacks *cb, tdm_gen_result *res, tdm_error *err);

/* Prompt tokens the chat would take (rendered as tdm_generator_chat() does).
 * Uses only the immutable tokenizer and template, so it may run on another
 * thread while a generation is in progress. */
tdm_status tdm_generator_count_chat(const tdm_generator *g, const tdm_gen_message *msgs,
                                    int32_t n_msgs, tdm_gen_thinking thinking, int32_t *n_tokens,
                                    tdm_error *err);

/* Continues a raw prompt (no template; <think> is not parsed: all text is
 * the answer). Same errors as tdm_generator_chat(). */
tdm_status tdm_generator_complete(tdm_generator *g, const char *prompt, const tdm_gen_params *p,
                                  const tdm_gen_callbacks *cb, tdm_gen_result *res,
                                  tdm_error *err);

/* ---- pieces usable on their own (and unit-tested) ---- */

/* Incremental scanner of ``` fences (a line whose first non-blank
 * characters, after at most 3 spaces, are 3 or more backticks). */
typedef struct tdm_fence_state {
    int32_t open_len;  /* backticks of the open fence, 0 when none is open */
    int32_t run;       /* backticks counted at the start of the current line */
    int32_t indent;    /* spaces before them */
    uint8_t phase;     /* where the scanner is within the line */
    uint8_t last_nl;   /* the last byte fed was '\n' (or nothing fed yet) */
} tdm_fence_state;

void tdm_fence_init(tdm_fence_state *f);
void tdm_fence_feed(tdm_fence_state *f, const char *text, size_t len);
/* Writes the text that closes an open fence into buf (NUL-terminated, ""
 * when none is open) and returns its length. cap >= 72 always suffices. */
size_t tdm_fence_closer(const tdm_fence_state *f, char *buf, size_t cap);

/* Whether the text ends at a sentence end: its last non-blank character is
 * . ! ? or the text ends with a newline (empty text counts as ended). */
bool tdm_gen_sentence_ended(const char *text, size_t len);

/* Length of the longest prefix of text[0..len) that is complete UTF-8:
 * a trailing, possibly incomplete multi-byte sequence is left out. */
size_t tdm_utf8_complete_len(const char *text, size_t len);

#endif
