/* layout_check_dense.cu - compile-time check (VM, no GPU) that mlasp27's ml_tiles gives main's shared-memory layout
 * (every offset, stage count and size) for every shape; the old formulas are copied from main
 * c428f19 (mla27 changes the FP8 QR shape on purpose: 4 stages). Compiles only if they agree:
 *   nvcc -DKVA_HAVE_CUDA=1 -Iinclude -Isrc/core -Isrc/plan -Isrc/attn/cuda -std=c++17 -arch=sm_90a -c dev/mlasp27/layout_check_dense.cu -o /tmp/x.o */
extern "C" {
#include "cuda_backend.h"
}
#include "mla_decode_mma.cuh"
template <int MT, bool QR = false, bool FP8 = false> struct old_cfg {
    static constexpr int M = 16 * MT;
    static constexpr int BN = MT == 4 ? 32 : 64;
    static constexpr int NST = MT == 4 || QR ? 3 : 2;
    static constexpr int TILE = BN * ML_D * 2;
    static constexpr int RAW = FP8 ? BN * ML_D : 0;
    static constexpr int P_STRIDE = BN * 2 + 16;
    static constexpr int OFF_RING = QR ? 0 : M * ML_D * 2;
    static constexpr int OFF_RAW = OFF_RING + (FP8 ? 1 : NST) * TILE;
    static constexpr int OFF_Q = !QR ? 0 : FP8 ? OFF_RING : (NST - 1) * TILE;
    static constexpr int OFF_P = OFF_RAW + NST * RAW;
    static constexpr int OFF_RED = OFF_P + M * P_STRIDE;
    static constexpr int SMEM = OFF_RED + 2 * ML_NW * 64 * 4;
};
template <int MT, bool QR, bool F> constexpr bool same()
{
    typedef old_cfg<MT, QR, F> A;
    typedef ml_cfg<MT, QR, F> B;
    return A::SMEM == B::SMEM && A::NST == B::NST && A::OFF_RAW == B::OFF_RAW && A::OFF_P == B::OFF_P &&
           A::OFF_RED == B::OFF_RED && A::OFF_Q == B::OFF_Q && A::OFF_RING == B::OFF_RING && A::RAW == B::RAW;
}
static_assert(same<1, false, false>() && same<1, true, false>() && same<2, false, false>() && same<4, false, false>(), "16");
static_assert(same<1, false, true>() && same<1, true, true>() && same<2, false, true>() && same<4, false, true>(), "fp8");
int main() { return 0; }
