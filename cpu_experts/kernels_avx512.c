/* AVX-512 kernels with VNNI (vpdpbusd / vpdpwssd), compiled with the Makefile's
 * AVX-512 flags (F, BW, VL, DQ, VNNI). Used only when CPUID reports
 * AVX512_VNNI; the same code without VNNI lives in kernels_avx512_novnni.c. */
#include "kernels_impl.h"
#include "kernels_x86.h"

#define TDM_VNNI 1
#define TDM_AVX512_TABLE tdm_kernels_avx512_vnni
#include "kernels_avx512_body.h"
