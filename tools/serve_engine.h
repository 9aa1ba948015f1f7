/*
 * serve_engine.h - the state of serve-sim's engine, shared by serve_engine.c
 * (the steps) and serve_verify.c (the --verify checks). Not part of the
 * module's interface (serve_sim.h).
 */
#ifndef KVA_SERVE_ENGINE_H
#define KVA_SERVE_ENGINE_H

#include "serve_sim.h"

/* Distinct offsets (in units of one query head, serve_shape.unit) at which
 * the random slices start. */
#define RAND_SHIFTS 64

/* --plan-probe: the CUDA plan's phase stamps (KVA__CUDA_PROBE_N) and the
 * columns of a step's row: a plan's total, the generic part, the seven CUDA
 * phases and the tail after the copy; the stream query before it; the same
 * ten for the plan repeated right after. */
#define SERVE_PROBE_STAMPS 8
#define SERVE_PROBE_PLAN 10
#define SERVE_PROBE_COLS (2 * SERVE_PROBE_PLAN + 1)

struct serve_engine {
    serve_opts o;
    serve_shape sh; /* elements per token of q, the write's sources, out */
    kva_context *ctx;
    kva_context *ref;   /* --verify only */
    kva_cache **caches; /* [L], in the backend's memory space */
    int dev;            /* --backend cuda */
    serve_dev *d;       /* its stream and 2L + 1 events */
    char err[256];      /* a failure outside the library (serve_engine_error) */
    char verr[256];     /* the first --verify mismatch (serve_engine_verify_error) */
    kva_pool *pool;
    size_t es;    /* bytes per element of the dtype */
    int32_t tmax; /* most tokens in one step (the token budget) */
    void *rand;   /* [tmax * (q + k + v) + RAND_SHIFTS * unit] random values */
    void *out;    /* [tmax, out] (CUDA: the checked layer's output, downloaded) */
    size_t n_rand;
    /* MLA: every layer's weights, [L] x (W_UK [H, Dn, Dc], W_UV [H, Dc, Dv]). */
    void *w;
    size_t n_w;
    /* CUDA: device twins of rand, out and w, the checked layer's output, slots. */
    void *d_rand, *d_out, *d_vout, *d_w;
    int64_t *d_slots;
    /* The step's metadata, sized for cap_r requests. */
    int32_t cap_r;
    int32_t *perm, *qsl, *seq_lens; /* [cap_r], [cap_r + 1], [cap_r] */
    int32_t *bt;                    /* [cap_r * cap_stride] */
    size_t cap_bt;
    int64_t *slots; /* [tmax] (CUDA: pinned) */
    int64_t step;
    int seen_state[KVA_STATE_EMPTY + 1];
    /* The step's plan: created by the first step, then re-planned in place
     * (kva_plan_update) by every step and layer-kind change, as an engine
     * keeps one plan; destroyed with the engine. */
    kva_plan *plan;
    /* --plan-probe: the library's stamps of the latest CUDA plan build, and
     * per decode-only step a row of SERVE_PROBE_COLS phase times (us). */
    double probe_st[SERVE_PROBE_STAMPS];
    double *probe;
    int32_t probe_rows, probe_cap;
    /* Reference check buffers. */
    int32_t *v_sel, *v_qsl, *v_seq, *v_bt;
    void *v_q, *v_out; /* [tmax, q], [tmax, out] */
    int64_t *v_slots;  /* [tmax] slots from the block-table rows */
    kva_cache *mirror; /* CUDA: host copy of the checked layer's cache (ref context) */
    kva_cache *expect; /* the new rows written by the reference (ref context) */
    /* --dcp: the combine (out receives the rank's heads, [tmax, H / N, D]).
     * --verify, rank 0: layer 0 unsharded (full, NB blocks of N * B tokens),
     * its slots [tmax] and output [tmax, H, D], the ranks' outputs [N][...]. */
    serve_dcp *dcp;
    kva_cache *full;
    int64_t *full_slots;
    void *full_out, *gathered;
};

/* Layer l's weights W_UK, W_UV in base (e->w or e->d_w); NULL for MHA models. */
static inline const void *serve_engine_w_uk(const serve_engine *e, const void *base, int32_t l)
{
    if (!base)
        return NULL;
    return (const char *)base + (size_t)l * (e->sh.w_uk + e->sh.w_uv) * e->es;
}
static inline const void *serve_engine_w_uv(const serve_engine *e, const void *base, int32_t l)
{
    if (!base)
        return NULL;
    return (const char *)serve_engine_w_uk(e, base, l) + e->sh.w_uk * e->es;
}

/* Bytes of a cache's K, V and token-scale storage over nb blocks
 * (serve_engine.c). */
void serve_cache_sizes(const kva_cache *c, int32_t nb, size_t *k, size_t *v, size_t *ts);
/* A failure of serve_device.c: its message becomes the engine's
 * (serve_engine.c). */
kva_status serve_engine_dev_fail(serve_engine *e, kva_status st);

/* ---- serve_verify.c ---- */

/* Host backends, right after layer l ran: checks where its new rows (k, v:
 * the write's host sources) went and its output e->out against the
 * reference; q is the layer's host query. */
kva_status serve_verify_host(serve_engine *e, int32_t R, int32_t stride, int32_t l, const void *q,
                             const void *k, const void *v, serve_stats *st);
/* CUDA, after the step's synchronization: the same for layer l, whose output
 * went to e->d_vout, on downloaded copies. */
kva_status serve_verify_device(serve_engine *e, int32_t R, int32_t stride, int32_t l,
                               serve_stats *st);

/* --dcp --verify after layer 0's combine (a collective): rank 0 compares
 * the ranks' combined heads with layer 0 run unsharded (serve_verify.c). */
kva_status serve_verify_dcp(serve_engine *e, int32_t R, int32_t stride, const void *q,
                            const void *k, const void *v, serve_stats *st);

#endif /* KVA_SERVE_ENGINE_H */
