/* cpu_level.c - the level this copy of the SIMD code was compiled for.
 *
 * It includes kernels_backend.h, which makes it one of the files a dispatched
 * build compiles once per level (Makefile: DSP_SRC), so the call below is
 * dispatched like every kernel: it answers the level of the code the
 * process actually runs, by the same compile-time test the kernels make.
 */
#include "base/cpu.h"
#include "kernels/kernels_backend.h"

/* The level of this object's compiler target. */
int ak_cpu_compiled_level(void) {
#if defined(AK_SIMD_AVX512) && defined(__AVX512VNNI__)
    return AK_CPU_AVX512VNNI;
#elif defined(AK_SIMD_AVX512)
    return AK_CPU_AVX512;
#elif defined(AK_SIMD_AVX2) && defined(__AVXVNNI__)
    return AK_CPU_AVX2VNNI;
#elif defined(AK_SIMD_AVX2)
    return AK_CPU_AVX2;
#elif defined(AK_SIMD_NEON)
    return AK_CPU_NEON;
#else
    return AK_CPU_SCALAR;
#endif
}
