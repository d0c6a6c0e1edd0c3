/* session: one conversation's state on a loaded model (KV cache of the
 * attention layers, conv + recurrent state of the DeltaNet layers, the tokens
 * it holds), with a fixed maximum context sized at creation. Nothing is
 * allocated after tdm_session_new(): evaluating tokens never allocates.
 *
 * Ownership: the session borrows the model (which must outlive it) and owns
 * its state and logits buffer. A session is used by one thread at a time;
 * internally the forward pass runs OpenMP-parallel.
 */
#ifndef TDM_SESSION_H
#define TDM_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include "executor.h"
#include "expert_cache.h"
#include "model.h"
#include "status.h"

typedef struct tdm_session tdm_session;

/* Called for every token position and MoE layer as routing is decided:
 * k expert ids (descending probability) and their renormalised weights.
 * pos is the token's position in the session. Used by the profiler. */
typedef void (*tdm_route_hook)(void *user, int32_t pos, int32_t layer, int32_t k,
                               const int32_t *experts, const float *weights);

/* Where the forward pass runs: the CPU forward (forward.h) or the model
 * resident on the GPU (forward_gpu.h). AUTO: CUDA when tdm_gpu_available(). */
typedef enum tdm_device {
    TDM_DEVICE_AUTO = 0,
    TDM_DEVICE_CPU,
    TDM_DEVICE_CUDA
} tdm_device;

/* "auto", "cpu", "cuda" -> *out; false for anything else. */
bool tdm_device_parse(const char *s, tdm_device *out);
const char *tdm_device_name(tdm_device d);

/* n_ctx: maximum tokens the session holds (prompt + generated). On the CPU. */
tdm_status tdm_session_new(tdm_model *m, int32_t n_ctx, tdm_session **out, tdm_error *err);
/* The same on the chosen device (AUTO resolved at creation; CUDA uploads the
 * whole model: TDM_ERR_UNSUPPORTED without CUDA, TDM_ERR_CUDA when it does not fit). */
tdm_status tdm_session_new_device(tdm_model *m, int32_t n_ctx, tdm_device dev, tdm_session **out, tdm_error *err);
/* On the GPU with the routed experts through the hybrid executor: VRAM
 * expert cache + CPU pool (forward_gpu.h tdm_forward_gpu_new_hybrid; xp's
 * profile and topology must outlive the session). */
tdm_status tdm_session_new_hybrid(tdm_model *m, int32_t n_ctx, const tdm_executor_params *xp, tdm_session **out,
                                  tdm_error *err);
/* The hybrid executor (statistics, cache) or NULL. */
tdm_executor *tdm_session_executor(tdm_session *s);
/* The VRAM budget plan of a hybrid session, or NULL. */
const tdm_budget *tdm_session_budget(const tdm_session *s);
/* CPU or CUDA: the device the session runs on. */
tdm_device tdm_session_device(const tdm_session *s);
void tdm_session_free(tdm_session *s);

int32_t tdm_session_n_ctx(const tdm_session *s);
int32_t tdm_session_n_past(const tdm_session *s);
/* The n_past tokens the state currently holds. */
const int32_t *tdm_session_tokens(const tdm_session *s);

void tdm_session_reset(tdm_session *s);

/* Drops tokens beyond n_keep where the state can return there (attention KV
 * can be cut anywhere; recurrent state only at positions where a checkpoint
 * was kept, see session.c). Returns the number of tokens actually kept
 * (<= n_keep; 0 means the session was reset). */
int32_t tdm_session_truncate(tdm_session *s, int32_t n_keep);

/* Appends n tokens (a prompt is processed in batches). Afterwards
 * tdm_session_logits() holds the logits of the last token. When logits_all is
 * non-NULL it receives [n][n_vocab] logits of every appended position.
 * TDM_ERR_INVALID when the context would overflow (nothing is appended). */
tdm_status tdm_session_eval(tdm_session *s, const int32_t *tokens, int32_t n, float *logits_all,
                            tdm_error *err);

/* As tdm_session_eval, returning the greedy choice after the last token
 * (tdm_sampler_argmax of its logits) in *next: a greedy decode step. On the
 * GPU the choice is made on the device and the logits stay there. next
 * may point into tokens (it is written last). */
tdm_status tdm_session_eval_greedy(tdm_session *s, const int32_t *tokens, int32_t n, int32_t *next,
                                   tdm_error *err);

/* [n_vocab] logits of the last evaluated token (valid after a successful
 * tdm_session_eval); NULL after tdm_session_eval_greedy. */
const float *tdm_session_logits(const tdm_session *s);

void tdm_session_set_route_hook(tdm_session *s, tdm_route_hook hook, void *user);

/* Saves the recurrent state at the current length as the "mark" truncation
 * checkpoint (replacing the previous mark; a no-op without recurrent layers).
 * Independently, tdm_session_eval keeps a "prompt" checkpoint after every
 * eval of more than one token; truncate restores the latest one that fits. */
void tdm_session_checkpoint(tdm_session *s);

/* The model the session runs on. */
const tdm_model *tdm_session_model(const tdm_session *s);

/* The underlying CPU forward (forward.h), e.g. for debug captures and the
 * hybrid executor. A session on CUDA that holds no tokens yet moves to the
 * CPU forward here (the GPU copy is freed); one that holds tokens returns
 * NULL, as does a failed move. */
typedef struct tdm_forward tdm_forward;
tdm_forward *tdm_session_forward(tdm_session *s);

#endif
