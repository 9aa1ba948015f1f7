#!/usr/bin/env python3
"""resolve.py FILE: resolves the merge conflict of mlasp27 and mla27 (06f18a2) in
src/attn/cuda/mla_decode_mma.cuh in place: mlasp27's side of every conflict hunk
(the body behind the key-source policy), then mla27's changes moved into the dense
policy ml_dense / ml_dense_rows (README.md here). Works whichever side is 'ours'."""
import re, sys

p = sys.argv[1]
s = open(p).read()
pat = re.compile(r'<<<<<<< ([^\n]*)\n(.*?)=======\n(.*?)>>>>>>> ([^\n]*)\n', re.S)
blocks = pat.findall(s)
assert len(blocks) == 6, f'expected the 6 conflict hunks, found {len(blocks)}'


def mine(b):  # mlasp27's side: the one that has the policy calls / ml_tiles
    a, c = b[1], b[2]
    key = ('ml_tiles', 'NP == 1', 'wi.template', 'W::template')
    if any(k in a for k in key) or (not a.strip() and 'ml_issue_any' in c):
        return a
    return c


res = [mine(b) for b in blocks]
res[0] = res[0].replace(
    ' * one 16-bit tile, then the ring [NST][BN, RAW_ROW] of raw bytes), NP',
    ' * one 16-bit tile, then the ring [NST][BN, RAW_ROW] of raw bytes; dense FP8\n'
    ' * with QR: NST = 4, the raw stages are half a tile, and the fourth fits), NP')
it = iter(res)
s = pat.sub(lambda m: next(it), s)
reps = [
    ('                kva__cp_async_commit();\n'
     '                row_ahead = ml_row<BN>(a, bt_row, kn + BN, kend);\n',
     '                kva__cp_async_commit();\n'),
    ('    template <int MT, bool QR> static constexpr int NST = MT == 4 || QR ? 3 : 2;',
     '    template <int MT, bool QR>\n'
     '    static constexpr int NST = RAW_ROW && QR ? 4 : MT == 4 || QR ? 3 : 2;'),
    ('    int32_t k0, kend;\n    int32_t lo[2], hi[2], pos[2], lo_all, hi_all;',
     '    int32_t k0, kend;\n'
     '    int64_t row_next; /* the thread\'s cache row in the next tile to issue */\n'
     '    int32_t lo[2], hi[2], pos[2], lo_all, hi_all;'),
    ('''        k0 = mi.w.k0;
        kend = mi.w.k1;
        return true;
    }
    /* The copies of tile kb: 16-bit rows (layout ml_off<0>) or FP8 rows (raw). */
    template <typename C>
    __device__ __forceinline__ void issue(const args &a, int32_t kb, uint32_t stage, int *) const
    {
        if constexpr (FP8)
            ml_issue_fp8<C::BN>(a, mi.bt_row, kb, kend, stage);
        else
            ml_issue<C::BN, 0>(a, mi.bt_row, kb, kend, stage);
    }''', '''        k0 = mi.w.k0;
        kend = mi.w.k1;
        row_next = ml_row<C::BN>(a, mi.bt_row, k0, kend);
        return true;
    }
    /* The copies of tile kb: 16-bit rows (layout ml_off<0>) or FP8 rows (raw);
     * then the block-table read of the next tile's row, so that its copies do
     * not wait for it. */
    template <typename C>
    __device__ __forceinline__ void issue(const args &a, int32_t kb, uint32_t stage, int *)
    {
        if constexpr (FP8)
            ml_issue_fp8_row<C::BN>(a, row_next, stage);
        else
            ml_issue_row<C::BN, 0>(a, row_next, stage);
        row_next = ml_row<C::BN>(a, mi.bt_row, kb + C::BN, kend);
    }'''),
    ('''    /* By the whole CTA, then a barrier. */
    template <typename C>
    static __device__ __forceinline__ void convert(const unsigned char *raw, unsigned char *tile,
                                                   int, int, int, int)
    {
        ml_fp8_tile<C::BN, Ty>(raw, tile);
        __syncthreads(); /* the tile, for every warp */
    }''', '''    /* Each of the MT warps of key slice kg converts KW / MT of its rows; those
     * warps meet before S reads them. */
    template <typename C>
    static __device__ __forceinline__ void convert(const unsigned char *raw, unsigned char *tile,
                                                   int key0, int rt, int kg, int lane)
    {
        constexpr int MT = C::M / 16;
        static_assert(C::KW % MT == 0, "FP8: the warps of a key slice convert its rows");
        ml_fp8_rows<C::KW / MT, Ty>(raw, tile, key0 + rt * (C::KW / MT), lane);
        if constexpr (MT == 1)
            __syncwarp();
        else
            asm volatile("bar.sync %0, %1;\\n" ::"r"(1 + kg), "r"(MT * 32) : "memory");
    }'''),
]
for a, b in reps:
    assert s.count(a) == 1, 'not found once: ' + a[:70]
    s = s.replace(a, b)
assert '<<<<<<<' not in s and '>>>>>>>' not in s
for gone in ('ml_issue_any', 'row_ahead', 'ml_fp8_tile', 'ml_issue_fp8<'):
    assert gone not in s, gone
open(p, 'w').write(s)
print('resolved', p)
