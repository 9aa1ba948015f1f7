/*
 * aliasing.c - the aliasing rule of kvattn.h ("Aliasing"), checked by
 * address arithmetic only: the run calls (src/attn/api.c) and the cache
 * operations (src/cache/) compare the byte ranges of their outputs with
 * those of their inputs and refuse an overlap before anything is written.
 * Pointers are compared, never read, so device pointers are fine and the
 * checks are graph-capture safe; each comparison is O(1).
 *
 * A span is one tensor argument: a contiguous range, or `rows` rows of
 * `bytes` bytes at a byte stride (token-strided k / v of the cache calls).
 * Two strided spans are compared row by row, exactly, when they share the
 * stride or one of them is a single row (a fused [T, Hkv*(D+Dv)] buffer
 * read into as k and v is accepted); spans of different strides are
 * compared by the ranges they cover (first to last byte), which may refuse
 * interleavings that do not touch.
 */
#include "internal.h"

int kva__overlaps(const void *a, size_t na, const void *b, size_t nb)
{
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    if (na == 0 || nb == 0)
        return 0;
    return x <= y ? y - x < na : x - y < nb;
}

size_t kva__span_bytes(int64_t rows, int64_t cols, size_t es)
{
    const uint64_t r = (uint64_t)rows, c = (uint64_t)cols;
    if (c != 0 && r > SIZE_MAX / c)
        return SIZE_MAX;
    const uint64_t n = r * c;
    return es != 0 && n > SIZE_MAX / es ? SIZE_MAX : (size_t)(n * es);
}

/* Rows of a span (at least 1). */
static int64_t span_rows(const kva__span *s)
{
    return s->rows > 1 ? s->rows : 1;
}

/* Bytes from the span's first byte to its last, saturated at SIZE_MAX. */
static size_t span_extent(const kva__span *s)
{
    const int64_t r = span_rows(s);
    if (r == 1)
        return s->bytes;
    const size_t head = kva__span_bytes(r - 1, s->stride, 1);
    return head > SIZE_MAX - s->bytes ? SIZE_MAX : head + s->bytes;
}

/* floor(n / s) for s > 0. */
static int64_t floor_div(int64_t n, int64_t s)
{
    int64_t q = n / s;
    return (n % s != 0 && n < 0) ? q - 1 : q;
}

int kva__spans_overlap(const kva__span *a, const kva__span *b)
{
    if (!a->p || !b->p || !a->bytes || !b->bytes)
        return 0;
    const size_t ea = span_extent(a), eb = span_extent(b);
    if (!kva__overlaps(a->p, ea, b->p, eb))
        return 0;
    const int64_t ra = span_rows(a), rb = span_rows(b);
    if (ra == 1 && rb == 1)
        return 1;
    if (ra > 1 && rb > 1 && a->stride != b->stride)
        return 1; /* different strides: the covered ranges decide */
    const int64_t s = ra > 1 ? a->stride : b->stride;
    /* Far beyond any real buffer; keeps the arithmetic below in range. */
    const size_t lim = (size_t)(INT64_MAX / 4);
    if (s <= 0 || ea > lim || eb > lim)
        return 1;
    /* Row t of a is [pa + t*s, + la), row u of b is [pb + u*s, + lb). They
     * overlap iff d - la < k*s < d + lb for k = t - u in [1 - rb, ra - 1],
     * d = pb - pa (|d| < max(ea, eb): the covered ranges overlap). */
    const uintptr_t pa = (uintptr_t)a->p, pb = (uintptr_t)b->p;
    const int64_t d = pb >= pa ? (int64_t)(pb - pa) : -(int64_t)(pa - pb);
    const int64_t la = (int64_t)a->bytes, lb = (int64_t)b->bytes;
    int64_t k = floor_div(d - la, s) + 1; /* the smallest k with k*s > d - la */
    if (k < 1 - rb)
        k = 1 - rb;
    return k <= ra - 1 && k * s < d + lb;
}

kva_status kva__check_disjoint(const char *fn, const kva__span *outs, int no, const kva__span *ins,
                               int ni)
{
    for (int i = 0; i < no; i++) {
        const kva__span *o = &outs[i];
        for (int j = 0; j < ni + i; j++) {
            const kva__span *x = j < ni ? &ins[j] : &outs[j - ni];
            if (!kva__spans_overlap(o, x))
                continue;
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "%s: output %s (%p, %zu bytes) overlaps %s %s (%p, %zu bytes): "
                             "outputs must not overlap the inputs or each other (kvattn.h, "
                             "Aliasing); nothing was written",
                             fn, o->name, o->p, span_extent(o), j < ni ? "input" : "output",
                             x->name, x->p, span_extent(x));
        }
    }
    return KVA_STATUS_OK;
}

void kva__cache_spans(const kva_cache *cache, kva__span spans[3])
{
    const int64_t nb = cache->desc.num_blocks;
    spans[0] = (kva__span){"cache K", cache->k,
                           kva__span_bytes(nb, cache->k_block_elems, cache->elem_size), 0, 0};
    spans[1] = (kva__span){"cache V", cache->v == cache->k ? NULL : cache->v,
                           kva__span_bytes(nb, cache->v_block_elems, cache->v_elem), 0, 0};
    spans[2] = (kva__span){
        "cache key scales", cache->k_token_scale,
        cache->k_token_scale
            ? kva__span_bytes(nb, (int64_t)cache->desc.block_size * cache->desc.num_kv_heads,
                              sizeof(float))
            : 0,
        0, 0};
}
