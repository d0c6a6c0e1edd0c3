/* sampler: picks the next token from logits.
 *
 * Pipeline (llama.cpp's default order): penalties over the last
 * penalty_last_n accepted tokens (repetition, frequency, presence) ->
 * greedy (argmax, lowest id on ties) when temperature <= 0, else
 * top-k -> top-p -> min-p (on the penalised, untempered distribution) ->
 * temperature -> a draw from the sampler's own PRNG (xoshiro256**, seeded
 * by splitmix64(seed)). Same params + seed + accepted history -> same tokens.
 *
 * Ownership/allocation: every buffer is sized for n_vocab at
 * tdm_sampler_new(); tdm_sampler_sample()/accept() never allocate. The
 * caller's logits are never modified. One thread at a time per sampler.
 */
#ifndef TDM_SAMPLER_H
#define TDM_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "status.h"

typedef struct tdm_sampler_params {
    float temperature;       /* <= 0: greedy. default 0.8 */
    int32_t top_k;           /* <= 0: off. default 40 */
    float top_p;             /* >= 1: off. default 0.95 */
    float min_p;             /* <= 0: off. default 0.05 */
    float repeat_penalty;    /* 1: off. logit>0 ? logit/rp : logit*rp. default 1 */
    float frequency_penalty; /* logit -= count * fp. default 0 */
    float presence_penalty;  /* logit -= (count > 0) * pp. default 0 */
    int32_t penalty_last_n;  /* window of accepted tokens the penalties see; 0: off. default 64 */
    uint64_t seed;           /* default 0x7A4D5EEDu */
} tdm_sampler_params;

typedef struct tdm_sampler tdm_sampler;

tdm_sampler_params tdm_sampler_default_params(void);

/* TDM_ERR_INVALID for n_vocab < 1, NaN/negative parameters, top_p <= 0,
 * penalty_last_n < 0, repeat_penalty <= 0. */
tdm_status tdm_sampler_new(int32_t n_vocab, const tdm_sampler_params *p, tdm_sampler **out,
                           tdm_error *err);
void tdm_sampler_free(tdm_sampler *s);

const tdm_sampler_params *tdm_sampler_params_get(const tdm_sampler *s);
/* Clears the penalty history and restarts the PRNG from params.seed. */
void tdm_sampler_reset(tdm_sampler *s);
/* Restarts the PRNG from seed (history kept). */
void tdm_sampler_seed(tdm_sampler *s, uint64_t seed);

/* Records a token in the penalty window: call it for prompt tokens you want
 * penalised and for every sampled token you keep. Ids out of range are ignored. */
void tdm_sampler_accept(tdm_sampler *s, int32_t token);

/* Returns the chosen id for logits[n_vocab] (does not accept it). NaN
 * logits count as -inf; if every logit is -inf/NaN, returns 0. */
int32_t tdm_sampler_sample(tdm_sampler *s, const float *logits);
/* True when tdm_sampler_sample returns tdm_sampler_argmax of the logits
 * whatever they and the history are: temperature <= 0 and no penalty. */
bool tdm_sampler_greedy(const tdm_sampler *s);
/* Greedy choice over n logits: the largest, the lowest id on ties; NaN never
 * wins (0 when nothing beats -inf). What tdm_sampler_sample does at
 * temperature 0 without penalties. */
int32_t tdm_sampler_argmax(const float *logits, int32_t n);
/* The sampler's e^x for x <= 0 (its weights and top-p masses): 0 below -87,
 * within 2 ulp of exp above; vectorisable. Exposed for its test. */
float tdm_sampler_exp_neg(float x);

#endif
