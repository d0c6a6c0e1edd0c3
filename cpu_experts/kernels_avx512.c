/* AVX-512 kernels (F, BW, VL, DQ; VNNI table used only when CPUID says so). */
#include "kernels_impl.h"

const tdm_kernel_table tdm_kernels_avx512 = {{0}};
const tdm_kernel_table tdm_kernels_avx512_vnni = {{0}};
