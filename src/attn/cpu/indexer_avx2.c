/* indexer_avx2.c - the indexer's logit tile on AVX2 + FMA: 8 keys per vector. */
#if defined(__x86_64__)

#include "indexer_cpu.h"

#include <immintrin.h>

#define VEC __m256
#define W 8
#define V_ZERO _mm256_setzero_ps
#define V_SET1 _mm256_set1_ps
#define V_LOAD _mm256_load_ps
#define V_LOADU _mm256_loadu_ps
#define V_STOREU _mm256_storeu_ps
#define V_FMA _mm256_fmadd_ps
#define V_MAX _mm256_max_ps
#define V_ADD _mm256_add_ps
#define V_MUL _mm256_mul_ps
#define TILE_FN kva__index_tile_avx2
#include "indexer_tile.inc"

#endif /* __x86_64__ */
