/* indexer_avx512.c - the indexer's logit tile on AVX-512: 16 keys per vector. */
#if defined(__x86_64__)

#include "indexer_cpu.h"

#include <immintrin.h>

#define VEC __m512
#define W 16
#define V_ZERO _mm512_setzero_ps
#define V_SET1 _mm512_set1_ps
#define V_LOAD _mm512_load_ps
#define V_LOADU _mm512_loadu_ps
#define V_STOREU _mm512_storeu_ps
#define V_FMA _mm512_fmadd_ps
#define V_MAX _mm512_max_ps
#define V_ADD _mm512_add_ps
#define V_MUL _mm512_mul_ps
#define TILE_FN kva__index_tile_avx512
#include "indexer_tile.inc"

#endif /* __x86_64__ */
