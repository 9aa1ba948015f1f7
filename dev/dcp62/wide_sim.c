/*
 * dev/dcp62/wide_sim.c - the arithmetic of split_merge.cu's merge_wide_kernel emulated in C
 * (threads in turn, f32) against the reference backend's kva_merge_states_n: 16 to 256 parts,
 * Dv 8 to 256, 1 and 4 channels per thread, -inf parts with NaN values, NaN / +inf / all -inf
 * rows. A check of the algorithm on a machine without a GPU (it passed on the VM; dropping
 * the select that skips weight-0 parts fails it), not of the CUDA code itself.
 *   gcc -O1 -std=c11 -fopenmp -Isrc/core -Itests -Iinclude dev/dcp62/wide_sim.c \
 *       build/libkvattn.a -lgomp -lpthread -lm -lcrypto -lxxhash -lcjson -o /tmp/wide_sim
 */
#include "harness.h"
#include "../bench/data.h"
#include <math.h>
#include <string.h>
static void wide(const float *outs, const float *lses, long os, long ls, int P, long rows, int Dv, int VW, float *out, float *lse_out) {
  const int CH = 16, C = Dv / VW, G = 256 / C;
  float s_m[256], s_l[256], s_acc[256 * 4];
  for (long n = 0; n < rows; n++) {
    for (int tid = 0; tid < 256; tid++) {
      int c = tid % C, g = tid / C, act = g < G;
      float m = -INFINITY, L = 0, acc[4] = {0, 0, 0, 0}; int nan = 0;
      for (int p0 = g; act && p0 < P; p0 += CH * G) {
        float l[16], x[16][4];
        for (int j = 0; j < CH; j++) { int p = p0 + j * G; int pv = p < P ? p : P - 1;
          l[j] = p < P ? lses[pv * ls + n] : -INFINITY;
          for (int i = 0; i < VW; i++) x[j][i] = outs[pv * os + n * Dv + c * VW + i]; }
        float mc = m;
        for (int j = 0; j < CH; j++) { nan |= l[j] != l[j] || l[j] == INFINITY; mc = fmaxf(mc, l[j]); }
        if (mc == -INFINITY || nan) continue;
        float sc = expf(m - mc); L *= sc; for (int i = 0; i < VW; i++) acc[i] *= sc;
        for (int j = 0; j < CH; j++) { float w = expf(l[j] - mc); L += w; for (int i = 0; i < VW; i++) acc[i] += w > 0 ? w * x[j][i] : 0; }
        m = mc;
      }
      s_m[tid] = nan ? NAN : m; s_l[tid] = L; for (int i = 0; i < VW; i++) s_acc[tid * VW + i] = acc[i];
    }
    for (int c = 0; c < C; c++) {
      float M = -INFINITY; int nn = 0;
      for (int k = 0; k < G; k++) { float mk = s_m[k * C + c]; nn |= mk != mk; M = fmaxf(M, mk); }
      float o[4], lv;
      if (nn || M == -INFINITY) { for (int i = 0; i < VW; i++) o[i] = nn ? NAN : 0; lv = nn ? NAN : -INFINITY; }
      else { float Lt = 0; for (int i = 0; i < VW; i++) o[i] = 0;
        for (int k = 0; k < G; k++) { int t = k * C + c; float w = expf(s_m[t] - M); Lt += w * s_l[t]; for (int i = 0; i < VW; i++) o[i] += w * s_acc[t * VW + i]; }
        for (int i = 0; i < VW; i++) o[i] /= Lt; lv = M + logf(Lt); }
      for (int i = 0; i < VW; i++) out[n * Dv + c * VW + i] = o[i];
      if (c == 0) lse_out[n] = lv;
    }
  }
}
static void test_sim(void) {
  kva_context_desc rd = {KVA_BACKEND_REF, 0, 0}; kva_context *ref; CHECK_OK(kva_context_create(&rd, &ref));
  kva_rng rng = {7}; const long rows = 12;
  int Ps[] = {16, 17, 33, 128, 256}, Dvs[] = {64, 24, 128, 256, 8};
  for (int pi = 0; pi < 5; pi++) for (int vi = 0; vi < 5; vi++) for (int VW = 1; VW <= 4; VW += 3) {
    int P = Ps[pi], Dv = Dvs[vi]; long part = rows * Dv, os = part, ls = rows;
    float *outs = malloc(4 * os * P), *lses = malloc(4 * ls * P), want[12 * 256], got[12 * 256], wl[12], gl[12];
    kva_test_fill(outs, KVA_DTYPE_F32, os * P, &rng, 1.0);
    for (int p = 0; p < P; p++) for (long n = 0; n < rows; n++) {
      float l = (float)(kva_rng_unit(&rng) * 8.0 - 4.0);
      if (n == 0 || (n != 3 && kva_rng_unit(&rng) < 0.33) || (n == 3 && p != P / 2)) l = -INFINITY;
      if (n == 1 && p == P - 1) l = NAN; if (n == 2 && p == 1) l = INFINITY;
      lses[p * ls + n] = l; if (l == -INFINITY) for (int d = 0; d < Dv; d++) outs[p * os + n * Dv + d] = NAN; }
    CHECK_OK(kva_merge_states_n(ref, P, 3, 4, Dv, KVA_DTYPE_F32, outs, os, lses, ls, want, wl));
    wide(outs, lses, os, ls, P, rows, Dv, VW, got, gl);
    size_t bad = 0;
    for (long i = 0; i < part; i++) { double a = got[i], w = want[i]; if (!(fabs(a - w) <= 1e-5 + 1e-5 * fabs(w) || (a != a && w != w))) bad++; }
    for (long n = 0; n < rows; n++) { double a = gl[n], w = wl[n]; if (!(a == w || fabs(a - w) <= 1e-5 || (a != a && w != w))) bad++; }
    CHECK_MSG(bad == 0, "P %d Dv %d VW %d: %zu bad", P, Dv, VW, bad);
    free(outs), free(lses);
  }
  kva_context_destroy(ref);
}
int main(void) { RUN(test_sim); return kva_test_finish(); }
