// Hot CPU loops are compiled for three x86-64 levels (AVX-512, AVX2+FMA, baseline SSE2); the loader picks the
// best the machine has. The project builds for baseline x86-64 so one binary runs anywhere, but the attention
// loops are several times faster with wide vectors. Elsewhere the attribute is empty.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define STRATA_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define STRATA_SIMD_CLONES
#endif
