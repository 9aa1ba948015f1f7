// dev/mla50/perq_check.cpp - host check that kva__dmma_rows' PERQ loop (one
// step per query, branch mla50-perq) gives the per-row loop's results: both
// loops as written in decode_mma_common.cuh, with the row's key range as an
// arbitrary function of its query (kva__cuda_row_keys depends only on the
// query index), the ALiBi slope as the row's head index. Random items:
// nh 1..80, nq 1..4, nrows = nq * nh (every caller) or any value up to it,
// k0 <= k1, the thread's rows g4, g4 + 8 for g4 0..15 (rows past nrows too).
//   g++ -O2 -std=c++17 dev/mla50/perq_check.cpp -o /tmp/perq_check && /tmp/perq_check
// A planted fault (FAULT=1: the PERQ loop skips the first row of each query) must fail.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
struct item { int32_t k0, k1, nh, i0; };
struct out { int32_t lo[2], hi[2], pos[2], hh[2], lo_all, hi_all; };
static int32_t L[64], H[64], P[64];
static void row_keys(int32_t i, int32_t &l, int32_t &h, int32_t &p) { l = L[i], h = H[i], p = P[i]; }
static out per_row(const item &w, int32_t nrows, int g4)
{
    out o = {};
    o.lo_all = w.k0, o.hi_all = w.k1;
    for (int hf = 0; hf < 2; hf++) o.hh[hf] = -1;
    for (int r = 0; r < nrows; r++) {
        const int32_t qi = r / w.nh, hh = r - qi * w.nh;
        int32_t p, h_, l_;
        row_keys(w.i0 + qi, l_, h_, p);
        const int32_t rlo = l_ > w.k0 ? l_ : w.k0, rhi = h_ < w.k1 ? h_ : w.k1;
        o.lo_all = rlo > o.lo_all ? rlo : o.lo_all;
        o.hi_all = rhi < o.hi_all ? rhi : o.hi_all;
        for (int hf = 0; hf < 2; hf++)
            if (r == g4 + hf * 8) o.lo[hf] = rlo, o.hi[hf] = rhi, o.pos[hf] = p, o.hh[hf] = hh;
    }
    return o;
}
static out per_query(const item &w, int32_t nrows, int g4, int fault)
{
    out o = {};
    o.lo_all = w.k0, o.hi_all = w.k1;
    for (int hf = 0; hf < 2; hf++) o.hh[hf] = -1;
    for (int32_t r0 = 0, qi = 0; r0 < nrows && w.nh > 0; r0 += w.nh, qi++) {
        int32_t p, h_, l_;
        row_keys(w.i0 + qi, l_, h_, p);
        const int32_t rlo = l_ > w.k0 ? l_ : w.k0, rhi = h_ < w.k1 ? h_ : w.k1;
        o.lo_all = rlo > o.lo_all ? rlo : o.lo_all;
        o.hi_all = rhi < o.hi_all ? rhi : o.hi_all;
        for (int hf = 0; hf < 2; hf++) {
            const int32_t r = g4 + hf * 8, hh = r - r0;
            if (hh >= fault && hh < w.nh && r < nrows)
                o.lo[hf] = rlo, o.hi[hf] = rhi, o.pos[hf] = p, o.hh[hf] = hh;
        }
    }
    return o;
}
int main()
{
    const char *f = getenv("FAULT");
    const int fault = f && *f == '1';
    std::mt19937 g(42);
    long n = 0, bad = 0;
    for (int t = 0; t < 200000; t++) {
        item w;
        w.nh = 1 + g() % 80;
        const int nq = 1 + g() % 4;
        w.i0 = g() % 8;
        const int32_t nrows = (g() % 2) ? nq * w.nh : (int32_t)(g() % (nq * w.nh + 1));
        w.k0 = g() % 5000;
        w.k1 = w.k0 + g() % 5000;
        for (int i = 0; i < 64; i++) {
            L[i] = g() % 6000, H[i] = L[i] + g() % 6000, P[i] = g() % 9000;
        }
        for (int g4 = 0; g4 < 16; g4++) {
            const out a = per_row(w, nrows, g4), b = per_query(w, nrows, g4, fault);
            n++;
            bool ok = a.lo_all == b.lo_all && a.hi_all == b.hi_all;
            for (int hf = 0; hf < 2; hf++)
                ok = ok && a.lo[hf] == b.lo[hf] && a.hi[hf] == b.hi[hf] && a.pos[hf] == b.pos[hf] &&
                     a.hh[hf] == b.hh[hf];
            bad += !ok;
        }
    }
    printf("perq_check%s: %ld cases, %ld differ\n", fault ? " (planted fault)" : "", n, bad);
    return bad != 0;
}
