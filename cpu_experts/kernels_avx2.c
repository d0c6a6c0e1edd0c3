/* AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c). */
#include "kernels_impl.h"

const tdm_kernel_table tdm_kernels_avx2 = {{0}};
