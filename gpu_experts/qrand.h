/* qrand: random but valid quantised weights, fast, for tests, benchmarks and
 * the synthetic model generator (tools/synth). Host code, in every build.
 *
 * Every block gets random payload bits and finite scales chosen so that the
 * dequantised values have roughly mean 0 and standard deviation `sigma`
 * (mins of Q4_1/Q5_1/Q2_K/Q4_K/Q5_K offset the payload's mean). The output
 * depends only on (type, n_blocks, sigma, seed); single-threaded: callers
 * parallelise over chunks with distinct seeds. */
#ifndef TDM_QRAND_H
#define TDM_QRAND_H

#include <stdint.h>

#include "quant.h"
#include "status.h"

/* Fills n_blocks blocks of type t (for plain types a block is 1 element).
 * TDM_ERR_UNSUPPORTED for types without a generator (the I-quants with grids,
 * ternary types). */
tdm_status tdm_qrand_fill(tdm_qtype t, void *dst, int64_t n_blocks, float sigma, uint64_t seed,
                          tdm_error *err);

/* A well-mixed 64-bit hash, to derive per-chunk seeds. */
uint64_t tdm_qrand_mix(uint64_t a, uint64_t b);

#endif
