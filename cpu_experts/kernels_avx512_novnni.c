/* AVX-512 kernels without VNNI (Skylake-X class CPUs). This file is compiled
 * with the portable flags; a target pragma enables F/BW/VL/DQ for the code
 * below only, so nothing here can use VNNI (a compiler given -mavx512vnni
 * may fuse madd+add into vpdpwssd on its own). Everything here runs only
 * after CPUID/XGETBV reported AVX-512 (cpu_experts/kernels.c). */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels_impl.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
#pragma GCC diagnostic ignored "-Wpsabi" /* static helpers only: no ABI is exposed */
#endif

#include "kernels_x86.h"

#define TDM_VNNI 0
#define TDM_AVX512_TABLE tdm_kernels_avx512
#include "kernels_avx512_body.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
