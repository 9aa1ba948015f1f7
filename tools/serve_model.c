/*
 * serve_model.c - the model of `kvattn serve-sim`: the presets (--model),
 * the per-token sizes of its tensors and cache, its caches, the step's plan
 * descriptor and one layer's work (cache write + attention), for both
 * attention kinds:
 *
 *   MHA/GQA (KVA_ATTN_MHA): q [T, H, D], new K and V [T, Hkv, D] written by
 *     kva_cache_write, kva_attention_run to out [T, H, D].
 *   MLA (KVA_ATTN_MLA, DeepSeek's multi-head latent attention, docs/mla.md):
 *     q [T, H, Dn + Dr], the new latent rows c_kv [T, Dc] and k_pe [T, Dr]
 *     written into a latent cache [NB, B, Dc + Dr], kva_mla_run with the
 *     layer's W_UK [H, Dn, Dc] and W_UV [H, Dc, Dv] to out [T, H, Dv]; the
 *     library picks the absorbed path for decodes and the compute-friendly
 *     path for prefills.
 */
#include "cli_quant.h"
#include "serve_sim.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The presets --model names. A preset sets the attention shapes and the layer
 * count; later flags (--layers, --num-heads, ...) still apply on top. */
typedef struct serve_preset {
    const char *name;
    const char *about;
    kva_attn_kind kind;
    int32_t layers, heads, kv_heads, head_dim; /* MHA */
    int32_t Dc, Dr, Dn, Dv;                    /* MLA */
    int32_t chunk, global_every;               /* attention_chunk of the local layers */
} serve_preset;

static const serve_preset presets[] = {
    {"llama3-8b-slice", "4 layers of Llama-3-8B's attention (H 32, Hkv 8, D 128)", KVA_ATTN_MHA, 4,
     32, 8, 128, 0, 0, 0, 0, 0, 0},
    {"deepseek-v2-lite", "DeepSeek-V2-Lite: 27 MLA layers, H 16, Dc 512, Dr 64, Dn 128, Dv 128",
     KVA_ATTN_MLA, 27, 16, 1, 576, 512, 64, 128, 128, 0, 0},
    /* Llama 4 (Scout, Maverick): 3 of 4 layers attend within chunks of 8192
     * (attention_chunk_size), every 4th layer sees the whole context. */
    {"llama4-scout-slice",
     "4 layers of Llama-4-Scout's attention (H 40, Hkv 8, D 128): 3 local (chunk 8192), 1 global",
     KVA_ATTN_MHA, 4, 40, 8, 128, 0, 0, 0, 0, 8192, 4},
};

int serve_opts_set_model(serve_opts *o, const char *name)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const serve_preset *p = &presets[i];
        if (strcmp(name, p->name) != 0)
            continue;
        o->kind = p->kind;
        o->layers = p->layers;
        o->heads = p->heads;
        o->kv_heads = p->kv_heads;
        o->head_dim = p->head_dim;
        o->mla_kv_rank = p->Dc;
        o->mla_rope_dim = p->Dr;
        o->mla_nope_dim = p->Dn;
        o->mla_v_dim = p->Dv;
        o->attention_chunk = p->chunk;
        o->chunk_global_every = p->global_every;
        return 1;
    }
    return 0;
}

void serve_print_models(FILE *f)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        fprintf(f, "                           %-17s %s\n", presets[i].name, presets[i].about);
}

void serve_model_shape(const serve_opts *o, serve_shape *s)
{
    const size_t H = (size_t)o->heads;
    memset(s, 0, sizeof *s);
    if (o->kind == KVA_ATTN_MLA) {
        const size_t Dc = (size_t)o->mla_kv_rank, Dr = (size_t)o->mla_rope_dim;
        const size_t Dn = (size_t)o->mla_nope_dim, Dv = (size_t)o->mla_v_dim;
        s->q = H * (Dn + Dr);
        s->k = Dc;
        s->v = Dr;
        s->out = H * Dv;
        s->unit = Dn + Dr;
        s->w_uk = H * Dn * Dc;
        s->w_uv = H * Dc * Dv;
    } else {
        const size_t D = (size_t)o->head_dim, Hkv = (size_t)o->kv_heads;
        s->q = H * D;
        s->k = Hkv * D;
        s->v = Hkv * D;
        s->out = H * D;
        s->unit = D;
    }
}

/* Bytes of one token's K and V of one kv head (MLA: its latent row), as the
 * format stores them. */
static int64_t row_bytes(const serve_opts *o)
{
    const int64_t es = (int64_t)kva_dtype_size(o->dtype);
    if (o->kind == KVA_ATTN_MLA) {
        const int64_t d = o->mla_kv_rank + o->mla_rope_dim;
        return o->kv_quant == KVA_QUANT_FP8_E4M3 ? d : d * es;
    }
    const int64_t d = o->head_dim;
    if (o->kv_quant == KVA_QUANT_INT8_CHANNEL || o->kv_quant == KVA_QUANT_FP8_E4M3)
        return 2 * d;
    if (o->kv_quant == KVA_QUANT_INT8_TOKEN_K)
        return 2 * d + 4; /* + the float32 key scale */
    if (o->kv_quant == KVA_QUANT_INT8_TOKEN_K_V16)
        return d + d * es + 4;
    return 2 * d * es;
}

int64_t serve_token_bytes(const serve_opts *o)
{
    return row_bytes(o) * (o->kind == KVA_ATTN_MLA ? 1 : o->kv_heads) * o->layers;
}

int64_t serve_token_bytes_mha(const serve_opts *o)
{
    if (o->kind != KVA_ATTN_MLA)
        return serve_token_bytes(o);
    /* The same heads with their own keys [Dn + Dr] and values [Dv], in the
     * cache's format (one byte per element for FP8). */
    const int64_t es = o->kv_quant == KVA_QUANT_FP8_E4M3 ? 1 : (int64_t)kva_dtype_size(o->dtype);
    return (int64_t)o->heads * (o->mla_nope_dim + o->mla_rope_dim + o->mla_v_dim) * es * o->layers;
}

int64_t serve_block_bytes(const serve_opts *o)
{
    return serve_token_bytes(o) * o->block_size;
}

/* Quantized formats get scalar static scales fitted to the random data
 * (uniform, |x| < 1.74), as `kvattn bench --kv-quant` uses; an MLA cache
 * takes k_scale only (its values are its keys' first Dc columns). */
kva_status serve_cache_create(kva_context *ctx, const serve_opts *o, kva_cache **out)
{
    const int mla = o->kind == KVA_ATTN_MLA;
    kva_cache_desc desc = {.num_blocks = o->num_blocks,
                           .block_size = o->block_size,
                           .num_kv_heads = mla ? 1 : o->kv_heads,
                           .head_dim = mla ? o->mla_kv_rank + o->mla_rope_dim : o->head_dim,
                           .head_dim_v = mla ? o->mla_kv_rank : 0,
                           .dtype = o->dtype,
                           .layout = KVA_LAYOUT_NHD,
                           .quant = o->kv_quant,
                           .kind = o->kind};
    kva_cli_quant q;
    const kva_quant_params *pp = kva_cli_quant_setup(o->kv_quant, o->dtype, &q, &desc.dtype);
    if (mla) { /* pp is &q.qp or NULL */
        q.qp.v_scale = NULL;
        q.qp.v_scale_len = 0;
    }
    return kva_cache_create_quant(ctx, &desc, pp, out);
}

int32_t serve_pool_block_size(const serve_opts *o)
{
    return o->dcp > 1 ? o->dcp * o->block_size : o->block_size;
}

int serve_layer_local(const serve_opts *o, int32_t l)
{
    const int32_t n = o->chunk_global_every;
    return o->attention_chunk > 0 && !(n > 0 && l % n == n - 1);
}

kva_plan_desc serve_step_desc(const serve_opts *o, int32_t R, const int32_t *qsl,
                              const int32_t *seq_lens, const int32_t *bt, int32_t stride, int local)
{
    kva_plan_desc pd = {0};
    pd.num_requests = R;
    pd.query_start_loc = qsl;
    pd.seq_lens = seq_lens;
    pd.block_table = bt;
    pd.block_table_stride = stride;
    pd.block_size = o->block_size;
    pd.num_heads = o->heads;
    pd.q_dtype = o->dtype;
    pd.causal = 1;
    pd.window_left = -1;
    pd.attention_chunk = local ? o->attention_chunk : 0;
    pd.cascade = o->cascade;
    if (o->dcp > 0) { /* serve_dcp.c: the pool's block table is the local one */
        pd.dcp_size = o->dcp;
        pd.dcp_rank = o->dcp_rank;
        pd.dcp_interleave = o->dcp_interleave;
    }
    if (o->kind == KVA_ATTN_MLA) {
        /* The latent cache's shape; the model's scale 1/sqrt(Dn + Dr). */
        pd.kind = KVA_ATTN_MLA;
        pd.num_kv_heads = 1;
        pd.head_dim = o->mla_kv_rank + o->mla_rope_dim;
        pd.head_dim_v = o->mla_kv_rank;
        pd.scale = (float)(1.0 / sqrt((double)(o->mla_nope_dim + o->mla_rope_dim)));
        pd.mla_qk_nope_head_dim = o->mla_nope_dim;
        pd.mla_v_head_dim = o->mla_v_dim;
    } else {
        pd.num_kv_heads = o->kv_heads;
        pd.head_dim = o->head_dim;
    }
    return pd;
}

kva_status serve_layer_attention(kva_context *ctx, const serve_opts *o, const kva_plan *plan,
                                 const void *q, const void *w_uk, const void *w_uv,
                                 const kva_cache *cache, void *out)
{
    if (o->kind == KVA_ATTN_MLA)
        return kva_mla_run(ctx, plan, q, w_uk, w_uv, cache, out, NULL);
    return kva_attention_run(ctx, plan, q, cache, NULL, out, NULL);
}
