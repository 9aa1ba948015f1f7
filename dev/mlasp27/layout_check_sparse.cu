/* layout_check_sparse.cu - compile-time check (VM, no GPU) that mlasp27's ml_tiles gives main's shared-memory layout
 * (every offset, stage count and size) for every shape; the old formulas are copied from main
 * c428f19. Compiles only if they agree:
 *   nvcc -DKVA_HAVE_CUDA=1 -Iinclude -Isrc/core -Isrc/plan -Isrc/attn/cuda -std=c++17 -arch=sm_90a -c dev/mlasp27/layout_check_sparse.cu -o /tmp/x.o */
extern "C" {
#include "cuda_backend.h"
}
#include "mla_decode_mma.cuh"
#include "mla_sparse_common.cuh"
#define SP_NW 8
template <int MT, bool FP8> struct sp_cfg {
    static constexpr int M = 16 * MT;
    static constexpr int BN = MT == 4 ? 32 : 64;
    static constexpr int NST = MT == 4 || (MT == 1 && FP8) ? 3 : 2;
    static constexpr int KW = BN * MT / SP_NW;
    static constexpr int NBS = KW / 8;
    static constexpr int CW = ML_DV * MT / SP_NW;
    static constexpr int NBO = CW / 8;
    static constexpr int TILE = BN * ML_D * 2;
    static constexpr int RAW = FP8 ? BN * sp_ds_mla::ROW : 0;
    static constexpr int P_STRIDE = BN * 2 + 16;
    static constexpr int NP = FP8 ? 4 : 1;
    static constexpr int P_BYTES = 16 * MT * P_STRIDE;
    static constexpr int OFF_TILE = M * ML_D * 2;
    static constexpr int OFF_RAW = OFF_TILE + (FP8 ? 1 : NST) * TILE;
    static constexpr int OFF_P = OFF_RAW + NST * RAW;
    static constexpr int OFF_RED = OFF_P + NP * P_BYTES;
    static constexpr int OFF_OK = OFF_RED + 2 * SP_NW * 64 * 4;
    static constexpr int SMEM = OFF_OK + NST * BN * 4;
};
template <int MT, bool F, typename S> constexpr bool same()
{
    typedef sp_cfg<MT, F> A;
    typedef ml_tiles<MT, false, S> B;
    return A::SMEM == B::SMEM && A::NST == B::NST && A::OFF_RAW == B::OFF_RAW && A::OFF_P == B::OFF_P &&
           A::OFF_RED == B::OFF_RED && A::OFF_OK == B::OFF_OK && A::OFF_TILE == B::OFF_RING &&
           A::P_BYTES == B::P_BYTES && A::NP == B::NP && A::RAW == B::RAW && A::NBO == B::NBO;
}
static_assert(same<1, false, sp_rows16>() && same<2, false, sp_rows16>() && same<4, false, sp_rows16>(), "rows16");
static_assert(same<1, true, sp_ds_mla>() && same<2, true, sp_ds_mla>() && same<4, true, sp_ds_mla>(), "ds");
int main() { return 0; }
