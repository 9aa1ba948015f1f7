/*
 * test_plan.c - kva_plan_create: step classification, counts, copies, resolved
 * scalars, max_block_id, every invalid input, and the decode-first reorder
 * helper. Every check runs on a reference and a CPU context.
 */
#include "harness.h"
#include "internal.h"

#define MAX_R 64
#define BS 16 /* block size used by the hand-built batches */

/* A batch built from q_lens and seq_lens, with its own arrays. */
typedef struct test_batch {
    int32_t R;
    int32_t qsl[MAX_R + 1]; /* [R+1] */
    int32_t seq[MAX_R];     /* [R] */
    int32_t bt[MAX_R * 16]; /* [R, stride] */
    float alibi[8];         /* [H] */
    kva_plan_desc d;
} test_batch;

/* Fills b for R requests; the block table gets distinct ids 100*r + j and a
 * stride of exactly ceil(max seq / BS) (at least 1). */
static void make_batch(test_batch *b, int32_t R, const int32_t *q_lens, const int32_t *seq_lens,
                       int32_t decode_threshold)
{
    memset(b, 0, sizeof *b);
    b->R = R;
    int32_t max_seq = 0;
    for (int32_t r = 0; r < R; r++) {
        b->qsl[r + 1] = b->qsl[r] + q_lens[r];
        b->seq[r] = seq_lens[r];
        if (seq_lens[r] > max_seq)
            max_seq = seq_lens[r];
    }
    int32_t stride = (max_seq + BS - 1) / BS;
    if (stride < 1)
        stride = 1;
    for (int32_t r = 0; r < R; r++)
        for (int32_t j = 0; j < stride; j++)
            b->bt[r * stride + j] = 100 * r + j;
    for (int h = 0; h < 8; h++)
        b->alibi[h] = -0.25f * (float)(h + 1);
    kva_plan_desc *d = &b->d;
    d->num_requests = R;
    d->query_start_loc = b->qsl;
    d->seq_lens = b->seq;
    d->block_table = b->bt;
    d->block_table_stride = stride;
    d->block_size = BS;
    d->decode_threshold = decode_threshold;
    d->num_heads = 8;
    d->num_kv_heads = 2;
    d->head_dim = 64;
    d->head_dim_v = 0;
    d->q_dtype = KVA_DTYPE_BF16;
    d->scale = 0.0f;
    d->causal = 1;
    d->window_left = -1;
    d->softcap = 0.0f;
    d->alibi_slopes = NULL;
}

static kva_context *make_ctx(kva_backend backend)
{
    kva_context_desc cd = {backend, 1, 0};
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&cd, &ctx));
    return ctx;
}

static const kva_backend kBackends[2] = {KVA_BACKEND_REF, KVA_BACKEND_CPU};

/* ---- classification ---- */

typedef struct class_case {
    int32_t R;
    int32_t q[6];
    int32_t s[6];
    int32_t thr;
    kva_attn_state want;
} class_case;

/* Expected states follow the definitions in kvattn.h; requests with q_len 0
 * are ignored (plan.c's documented choice). */
static const class_case kCases[] = {
    {3, {1, 1, 1}, {5, 9, 1}, 0, KVA_STATE_DECODE_ONLY},
    {2, {1, 1}, {5, 9}, 4, KVA_STATE_DECODE_ONLY},
    {2, {1, 3}, {10, 20}, 4, KVA_STATE_SPEC_DECODING},
    {3, {2, 0, 1}, {2, 5, 3}, 2, KVA_STATE_SPEC_DECODING},
    {2, {1, 100}, {10, 100}, 0, KVA_STATE_CHUNKED_PREFILL},
    {2, {100, 1}, {100, 10}, 0, KVA_STATE_CHUNKED_PREFILL},
    {2, {1, 3}, {4, 8}, 1, KVA_STATE_CHUNKED_PREFILL},
    {3, {1, 0, 4}, {3, 90, 4}, 1, KVA_STATE_CHUNKED_PREFILL},
    {2, {5, 7}, {5, 7}, 0, KVA_STATE_PREFILL_NO_CACHE},
    {1, {3}, {3}, 1, KVA_STATE_PREFILL_NO_CACHE},
    {2, {5, 7}, {5, 9}, 0, KVA_STATE_PREFILL_CACHE_HIT},
    {2, {6, 2}, {6, 50}, 1, KVA_STATE_PREFILL_CACHE_HIT},
    {0, {0}, {0}, 0, KVA_STATE_EMPTY},
    {2, {0, 0}, {3, 0}, 0, KVA_STATE_EMPTY},
    {3, {0, 1, 0}, {4, 6, 2}, 0, KVA_STATE_DECODE_ONLY},
};

static void test_classify(void)
{
    for (int bi = 0; bi < 2; bi++) {
        kva_context *ctx = make_ctx(kBackends[bi]);
        for (size_t c = 0; c < sizeof kCases / sizeof kCases[0]; c++) {
            const class_case *k = &kCases[c];
            test_batch b;
            make_batch(&b, k->R, k->q, k->s, k->thr);
            kva_plan *plan = NULL;
            CHECK_OK(kva_plan_create(ctx, &b.d, &plan));
            if (!plan)
                continue;
            kva_plan_info info;
            CHECK_OK(kva_plan_get_info(plan, &info));
            CHECK_MSG(info.state == k->want, "case %zu: state %s, want %s", c,
                      kva_attn_state_name(info.state), kva_attn_state_name(k->want));
            /* Counts straight from the definitions. */
            int32_t thr = k->thr == 0 ? 1 : k->thr;
            int32_t nd = 0, ndt = 0, np = 0, npt = 0, T = 0, mq = 0, ms = 0, df = 1;
            for (int32_t r = 0; r < k->R; r++) {
                T += k->q[r];
                if (k->q[r] == 0)
                    continue;
                if (k->q[r] <= thr) {
                    nd++, ndt += k->q[r];
                    for (int32_t e = 0; e < r; e++)
                        if (k->q[e] > thr)
                            df = 0;
                } else {
                    np++, npt += k->q[r];
                }
                mq = k->q[r] > mq ? k->q[r] : mq;
                ms = k->s[r] > ms ? k->s[r] : ms;
            }
            CHECK_MSG(info.num_tokens == T, "case %zu: T %d want %d", c, info.num_tokens, T);
            CHECK_MSG(info.num_decodes == nd && info.num_decode_tokens == ndt,
                      "case %zu: decodes %d/%d want %d/%d", c, info.num_decodes,
                      info.num_decode_tokens, nd, ndt);
            CHECK_MSG(info.num_prefills == np && info.num_prefill_tokens == npt,
                      "case %zu: prefills %d/%d want %d/%d", c, info.num_prefills,
                      info.num_prefill_tokens, np, npt);
            CHECK_MSG(info.decode_first == df, "case %zu: decode_first %d want %d", c,
                      info.decode_first, df);
            CHECK_MSG(info.max_q_len == mq && info.max_seq_len == ms,
                      "case %zu: max_q_len %d max_seq_len %d, want %d %d", c, info.max_q_len,
                      info.max_seq_len, mq, ms);
            CHECK(plan->backend == kBackends[bi]);
            CHECK(plan->workspace_bytes <= ctx->workspace_bytes);
            kva_plan_destroy(plan);
        }
        kva_context_destroy(ctx);
    }
}

static void test_state_names(void)
{
    CHECK(strcmp(kva_attn_state_name(KVA_STATE_PREFILL_NO_CACHE), "prefill_no_cache") == 0);
    CHECK(strcmp(kva_attn_state_name(KVA_STATE_PREFILL_CACHE_HIT), "prefill_cache_hit") == 0);
    CHECK(strcmp(kva_attn_state_name(KVA_STATE_DECODE_ONLY), "decode_only") == 0);
    CHECK(strcmp(kva_attn_state_name(KVA_STATE_CHUNKED_PREFILL), "chunked_prefill") == 0);
    CHECK(strcmp(kva_attn_state_name(KVA_STATE_SPEC_DECODING), "spec_decoding") == 0);
    CHECK(strcmp(kva_attn_state_name(KVA_STATE_EMPTY), "empty") == 0);
    CHECK(strcmp(kva_attn_state_name((kva_attn_state)77), "invalid") == 0);
}

/* ---- copies, resolved scalars, kv_start, max_block_id ---- */

static void test_copies_independent(void)
{
    const int32_t q[4] = {1, 7, 1, 20};
    const int32_t s[4] = {33, 7, 64, 40};
    for (int bi = 0; bi < 2; bi++) {
        kva_context *ctx = make_ctx(kBackends[bi]);
        test_batch b;
        make_batch(&b, 4, q, s, 0);
        b.d.alibi_slopes = b.alibi;
        b.d.causal = 7;
        kva_plan *plan = NULL;
        CHECK_OK(kva_plan_create(ctx, &b.d, &plan));
        if (!plan) {
            kva_context_destroy(ctx);
            continue;
        }
        test_batch orig = b;
        kva_plan_info before;
        CHECK_OK(kva_plan_get_info(plan, &before));
        /* Scribble over every caller array. */
        for (int i = 0; i <= 4; i++)
            b.qsl[i] = 1000 - i;
        for (int i = 0; i < 4; i++)
            b.seq[i] = -5;
        for (int i = 0; i < 4 * b.d.block_table_stride; i++)
            b.bt[i] = -9;
        for (int i = 0; i < 8; i++)
            b.alibi[i] = NAN;
        kva_plan_info after;
        CHECK_OK(kva_plan_get_info(plan, &after));
        CHECK(memcmp(&before, &after, sizeof before) == 0);
        CHECK(memcmp(plan->query_start_loc, orig.qsl, 5 * sizeof(int32_t)) == 0);
        CHECK(memcmp(plan->seq_lens, orig.seq, 4 * sizeof(int32_t)) == 0);
        CHECK(plan->block_table != NULL);
        if (plan->block_table)
            CHECK(memcmp(plan->block_table, orig.bt,
                         (size_t)4 * orig.d.block_table_stride * sizeof(int32_t)) == 0);
        CHECK(plan->alibi_slopes != NULL);
        if (plan->alibi_slopes)
            CHECK(memcmp(plan->alibi_slopes, orig.alibi, 8 * sizeof(float)) == 0);
        CHECK(plan->d.query_start_loc == NULL && plan->d.seq_lens == NULL);
        CHECK(plan->d.block_table == NULL && plan->d.alibi_slopes == NULL);
        /* kv_start: exclusive prefix sum of seq_lens. */
        int64_t acc = 0;
        for (int r = 0; r < 4; r++) {
            CHECK(plan->kv_start[r] == acc);
            acc += orig.seq[r];
        }
        CHECK(plan->kv_start[4] == acc);
        /* Resolved scalars. */
        CHECK(plan->d.scale == (float)(1.0 / sqrt(64.0)));
        CHECK(plan->d.head_dim_v == 64);
        CHECK(plan->d.decode_threshold == 1);
        CHECK(plan->d.causal == 1);
        CHECK(plan->d.num_heads == 8 && plan->d.num_kv_heads == 2);
        CHECK(plan->d.block_size == BS && plan->d.block_table_stride == 4);
        kva_plan_destroy(plan);

        /* An explicit scale, Dv and threshold are kept. */
        make_batch(&b, 4, q, s, 3);
        b.d.scale = 0.5f;
        b.d.head_dim_v = 128;
        b.d.causal = 0;
        plan = NULL;
        CHECK_OK(kva_plan_create(ctx, &b.d, &plan));
        if (plan) {
            CHECK(plan->d.scale == 0.5f && plan->d.head_dim_v == 128);
            CHECK(plan->d.decode_threshold == 3 && plan->d.causal == 0);
            CHECK(plan->alibi_slopes == NULL);
        }
        kva_plan_destroy(plan);
        kva_context_destroy(ctx);
    }
}

static void test_max_block_id(void)
{
    kva_context *ctx = make_ctx(KVA_BACKEND_REF);
    /* Request 0: seq 17 -> 2 blocks; request 1: q_len 0 (ignored); request 2: seq 16 -> 1 block. */
    const int32_t q[3] = {1, 0, 16};
    const int32_t s[3] = {17, 40, 16};
    test_batch b;
    make_batch(&b, 3, q, s, 0); /* stride 3 */
    int32_t *bt = b.bt;
    const int32_t rows[3][3] = {{5, 9, 500}, {700, 701, -1}, {7, -3, 800}};
    for (int r = 0; r < 3; r++)
        for (int j = 0; j < 3; j++)
            bt[r * 3 + j] = rows[r][j];
    kva_plan *plan = NULL;
    /* Entries past a request's need, and the q_len-0 request's row, are never
     * read: neither a negative id there nor a big one matters. */
    CHECK_OK(kva_plan_create(ctx, &b.d, &plan));
    if (plan)
        CHECK_MSG(plan->max_block_id == 9, "max_block_id %d", plan->max_block_id);
    kva_plan_destroy(plan);

    /* Without a block table (ragged-only plan): -1 and no copy. */
    b.d.block_table = NULL;
    b.d.block_size = 0;
    b.d.block_table_stride = 0;
    plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &b.d, &plan));
    if (plan) {
        CHECK(plan->max_block_id == -1);
        CHECK(plan->block_table == NULL);
    }
    kva_plan_destroy(plan);

    /* An empty batch may come without any arrays. */
    kva_plan_desc d = b.d;
    d.num_requests = 0;
    d.query_start_loc = NULL;
    d.seq_lens = NULL;
    plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &d, &plan));
    if (plan) {
        CHECK(plan->info.state == KVA_STATE_EMPTY && plan->info.num_tokens == 0);
        CHECK(plan->kv_start[0] == 0 && plan->max_block_id == -1);
    }
    kva_plan_destroy(plan);
    kva_plan_destroy(NULL);
    kva_context_destroy(ctx);
}

/* ---- invalid input ---- */

static char sentinel_byte;
#define SENTINEL ((kva_plan *)(void *)&sentinel_byte)

/* Creates a plan from desc expecting status and a message that mentions substr;
 * *out must keep its previous value. */
#define EXPECT_BAD(ctx_, desc_, status_, substr_)                                                  \
    do {                                                                                           \
        kva_plan *p_ = SENTINEL;                                                                   \
        CHECK_STATUS(kva_plan_create((ctx_), (desc_), &p_), (status_));                            \
        CHECK_ERROR_MENTIONS(substr_);                                                             \
        CHECK(p_ == SENTINEL);                                                                     \
        if (p_ != SENTINEL)                                                                        \
            kva_plan_destroy(p_);                                                                  \
    } while (0)

/*
 * The block-table scan (check_batch): max_block_id and the first negative id
 * of a read row, on the portable loop and on the AVX2 one (plan_scan_avx2.c,
 * where the CPU has it), for rows of 1..40 ids (the vector loop, its
 * overlapping last eight, rows shorter than eight) and block sizes that are
 * and are not powers of two. Ids past a request's need are never read: big
 * and negative ones are planted there.
 */
static void test_block_scan(void)
{
    enum { R = 5, STRIDE = 48 };
    static const int32_t sizes[3] = {16, 5, 1};
    kva_context *ctx = make_ctx(KVA_BACKEND_REF);
    const int has_avx2 = ctx->cpu_features.avx2;
    kva_rng rng = {777u};
    int32_t qsl[R + 1], seq[R], bt[R * STRIDE];
    for (int path = 0; path < 1 + has_avx2; path++) {
        ctx->cpu_features.avx2 = path; /* 0: the portable loop */
        for (int si = 0; si < 3; si++) {
            const int32_t B = sizes[si];
            for (int32_t n = 1; n <= 40; n++) {
                /* Request 1 reads n blocks, the others 1..STRIDE; request 3 has q_len 0. */
                int32_t need[R], want = -1;
                qsl[0] = 0;
                for (int32_t r = 0; r < R; r++) {
                    need[r] = r == 1 ? n : kva_rng_int(&rng, 1, STRIDE);
                    seq[r] = (need[r] - 1) * B + kva_rng_int(&rng, 1, B);
                    qsl[r + 1] = qsl[r] + (r == 3 ? 0 : 1);
                    for (int32_t j = 0; j < STRIDE; j++) {
                        const int32_t id = kva_rng_int(&rng, 0, 1 << 20);
                        const int read = j < need[r] && r != 3;
                        bt[r * STRIDE + j] = read ? id : (j & 1 ? -1 - id : (1 << 30) + id);
                        if (read && id > want)
                            want = id;
                    }
                }
                test_batch b;
                const int32_t q1[1] = {1}, s1[1] = {1};
                make_batch(&b, 1, q1, s1, 0);
                b.d.num_requests = R;
                b.d.query_start_loc = qsl;
                b.d.seq_lens = seq;
                b.d.block_table = bt;
                b.d.block_table_stride = STRIDE;
                b.d.block_size = B;
                kva_plan *plan = NULL;
                CHECK_OK(kva_plan_create(ctx, &b.d, &plan));
                if (plan)
                    CHECK_MSG(plan->max_block_id == want,
                              "path %d B %d n %d: max_block_id %d, want %d", path, (int)B, (int)n,
                              (int)plan->max_block_id, (int)want);
                kva_plan_destroy(plan);
                /* A negative id at each read position of request 1 is named. */
                for (int32_t j = 0; j < n; j++) {
                    const int32_t keep = bt[STRIDE + j];
                    bt[STRIDE + j] = -2 - j;
                    char msg[64];
                    snprintf(msg, sizeof msg, "entry %d of request 1 is %d", (int)j, (int)(-2 - j));
                    EXPECT_BAD(ctx, &b.d, KVA_STATUS_OUT_OF_RANGE, msg);
                    bt[STRIDE + j] = keep;
                }
            }
        }
    }
    ctx->cpu_features.avx2 = has_avx2;
    kva_context_destroy(ctx);
}

static void test_bad_inputs(void)
{
    const int32_t q[3] = {1, 4, 1};
    const int32_t s[3] = {20, 33, 9};
    for (int bi = 0; bi < 2; bi++) {
        kva_context *ctx = make_ctx(kBackends[bi]);
        test_batch b;
        make_batch(&b, 3, q, s, 0); /* stride 3 */
        kva_plan *p = SENTINEL;
        CHECK_STATUS(kva_plan_create(NULL, &b.d, &p), KVA_STATUS_NULL_POINTER);
        CHECK_ERROR_MENTIONS("ctx");
        CHECK(p == SENTINEL);
        CHECK_STATUS(kva_plan_create(ctx, NULL, &p), KVA_STATUS_NULL_POINTER);
        CHECK_ERROR_MENTIONS("desc");
        CHECK(p == SENTINEL);
        CHECK_STATUS(kva_plan_create(ctx, &b.d, NULL), KVA_STATUS_NULL_POINTER);
        CHECK_ERROR_MENTIONS("out");

        kva_plan_desc d;
#define WITH(field, value, status, substr)                                                         \
    do {                                                                                           \
        d = b.d;                                                                                   \
        d.field = (value);                                                                         \
        EXPECT_BAD(ctx, &d, status, substr);                                                       \
    } while (0)
        WITH(num_requests, -1, KVA_STATUS_INVALID_ARGUMENT, "num_requests");
        WITH(query_start_loc, NULL, KVA_STATUS_NULL_POINTER, "query_start_loc");
        WITH(seq_lens, NULL, KVA_STATUS_NULL_POINTER, "seq_lens");
        WITH(num_heads, 0, KVA_STATUS_INVALID_ARGUMENT, "num_heads");
        WITH(num_kv_heads, 0, KVA_STATUS_INVALID_ARGUMENT, "num_kv_heads");
        WITH(num_kv_heads, 3, KVA_STATUS_INVALID_ARGUMENT, "num_kv_heads = 3");
        WITH(num_kv_heads, 3, KVA_STATUS_INVALID_ARGUMENT, "num_heads = 8");
        WITH(head_dim, 12, KVA_STATUS_UNSUPPORTED, "head_dim = 12");
        WITH(head_dim, 0, KVA_STATUS_INVALID_ARGUMENT, "head_dim = 0");
        WITH(head_dim, KVA_MAX_HEAD_DIM + 8, KVA_STATUS_UNSUPPORTED, "head_dim = 584");
        WITH(head_dim_v, KVA_MAX_HEAD_DIM + 8, KVA_STATUS_UNSUPPORTED, "head_dim_v = 584");
        WITH(kind, KVA_ATTN_KIND_COUNT_, KVA_STATUS_INVALID_ARGUMENT, "kind = 3");
        WITH(kind, (kva_attn_kind)-1, KVA_STATUS_INVALID_ARGUMENT, "kind = -1");
        WITH(kind, KVA_ATTN_MLA, KVA_STATUS_INVALID_ARGUMENT, "MLA plan");
        WITH(head_dim_v, 20, KVA_STATUS_UNSUPPORTED, "head_dim_v = 20");
        WITH(head_dim_v, -8, KVA_STATUS_INVALID_ARGUMENT, "head_dim_v = -8");
        WITH(num_heads, KVA_MAX_HEADS + 1, KVA_STATUS_INVALID_ARGUMENT, "num_heads = 4097");
        WITH(num_kv_heads, KVA_MAX_HEADS + 1, KVA_STATUS_INVALID_ARGUMENT, "num_kv_heads = 4097");
        WITH(q_dtype, KVA_DTYPE_I8, KVA_STATUS_UNSUPPORTED, "q_dtype");
        WITH(q_dtype, (kva_dtype)99, KVA_STATUS_UNSUPPORTED, "q_dtype");
        WITH(block_size, 0, KVA_STATUS_INVALID_ARGUMENT, "block_size");
        WITH(block_table_stride, -1, KVA_STATUS_INVALID_ARGUMENT, "block_table_stride");
        WITH(scale, -1.0f, KVA_STATUS_INVALID_ARGUMENT, "scale");
        WITH(scale, NAN, KVA_STATUS_INVALID_ARGUMENT, "scale");
        WITH(scale, INFINITY, KVA_STATUS_INVALID_ARGUMENT, "scale");
        WITH(softcap, -2.0f, KVA_STATUS_INVALID_ARGUMENT, "softcap");
        WITH(softcap, NAN, KVA_STATUS_INVALID_ARGUMENT, "softcap");
        WITH(window_left, -2, KVA_STATUS_INVALID_ARGUMENT, "window_left");
        WITH(decode_threshold, -1, KVA_STATUS_INVALID_ARGUMENT, "decode_threshold");

        /* Batch arrays: each edit on a private copy, reverted afterwards. */
        b.qsl[0] = 1;
        EXPECT_BAD(ctx, &b.d, KVA_STATUS_INVALID_ARGUMENT, "query_start_loc[0]");
        b.qsl[0] = 0;
        int32_t saved = b.qsl[2];
        b.qsl[2] = 0; /* 0, 1, 0, 6: decreases at index 2 */
        EXPECT_BAD(ctx, &b.d, KVA_STATUS_INVALID_ARGUMENT, "query_start_loc decreases at index 2");
        b.qsl[2] = saved;
        b.seq[1] = -4;
        EXPECT_BAD(ctx, &b.d, KVA_STATUS_INVALID_ARGUMENT, "seq_lens[1] = -4");
        b.seq[1] = 3; /* q_len 4 > seq_len 3 */
        EXPECT_BAD(ctx, &b.d, KVA_STATUS_OUT_OF_RANGE, "request 1");
        EXPECT_BAD(ctx, &b.d, KVA_STATUS_OUT_OF_RANGE, "seq_lens[1] = 3");
        EXPECT_BAD(ctx, &b.d, KVA_STATUS_OUT_OF_RANGE, "causal = 1");
        {
            /* Non-causal (cross-attention): more queries than keys is valid. */
            kva_plan_desc nc = b.d;
            nc.causal = 0;
            kva_plan *pl = NULL;
            CHECK_OK(kva_plan_create(ctx, &nc, &pl));
            kva_plan_destroy(pl);
        }
        b.seq[1] = KVA_MAX_SEQ_LEN + 1; /* past the limit (the table would be short too) */
        EXPECT_BAD(ctx, &b.d, KVA_STATUS_OUT_OF_RANGE, "KVA_MAX_SEQ_LEN");
        EXPECT_BAD(ctx, &b.d, KVA_STATUS_OUT_OF_RANGE, "seq_lens[1] = 1073741825");
        b.seq[1] = 33;

        /* The table is one block short for request 1 (33 tokens need 3 blocks of 16). */
        d = b.d;
        d.block_table_stride = 2;
        EXPECT_BAD(ctx, &d, KVA_STATUS_OUT_OF_RANGE, "block table too short for seq_len");
        EXPECT_BAD(ctx, &d, KVA_STATUS_OUT_OF_RANGE, "request 1");
        EXPECT_BAD(ctx, &d, KVA_STATUS_OUT_OF_RANGE, "seq_lens = 33");
        EXPECT_BAD(ctx, &d, KVA_STATUS_OUT_OF_RANGE, "block_table_stride = 2");
        /* A stride of 0 with seq_lens 0 everywhere is fine. */
        {
            const int32_t zq[2] = {0, 0}, zs[2] = {0, 0};
            test_batch z;
            make_batch(&z, 2, zq, zs, 0);
            z.d.block_table_stride = 0;
            kva_plan *zp = NULL;
            CHECK_OK(kva_plan_create(ctx, &z.d, &zp));
            kva_plan_destroy(zp);
        }

        /* A negative id in an entry request 1 needs (its third block). */
        b.bt[1 * 3 + 2] = -1;
        EXPECT_BAD(ctx, &b.d, KVA_STATUS_OUT_OF_RANGE, "request 1");
        EXPECT_BAD(ctx, &b.d, KVA_STATUS_OUT_OF_RANGE, "entry 2");
        b.bt[1 * 3 + 2] = 102;
        /* Request 2 (seq 9) needs one block only: a negative id after it is fine. */
        b.bt[2 * 3 + 1] = -1;
        kva_plan *okp = NULL;
        CHECK_OK(kva_plan_create(ctx, &b.d, &okp));
        kva_plan_destroy(okp);

        b.d.alibi_slopes = b.alibi;
        b.alibi[2] = NAN;
        EXPECT_BAD(ctx, &b.d, KVA_STATUS_INVALID_ARGUMENT, "alibi_slopes[2]");
        b.alibi[2] = INFINITY;
        EXPECT_BAD(ctx, &b.d, KVA_STATUS_INVALID_ARGUMENT, "alibi_slopes[2]");
        b.alibi[2] = 0.5f;
        okp = NULL;
        CHECK_OK(kva_plan_create(ctx, &b.d, &okp));
        kva_plan_destroy(okp);
        /* window_left -1 and a positive softcap are valid. */
        d = b.d;
        d.window_left = -1;
        d.softcap = 30.0f;
        okp = NULL;
        CHECK_OK(kva_plan_create(ctx, &d, &okp));
        kva_plan_destroy(okp);
        /* A window wider than KVA_MAX_SEQ_LEN excludes nothing: stored as no window. */
        d.window_left = INT32_MAX;
        okp = NULL;
        CHECK_OK(kva_plan_create(ctx, &d, &okp));
        CHECK(okp && okp->d.window_left == -1);
        kva_plan_destroy(okp);
        {
            /* More query tokens than KVA_MAX_SEQ_LEN (non-causal, no keys). */
            const int32_t bigq[2] = {0, KVA_MAX_SEQ_LEN + 1}, zero[1] = {0};
            d = b.d;
            d.num_requests = 1;
            d.query_start_loc = bigq;
            d.seq_lens = zero;
            d.causal = 0;
            EXPECT_BAD(ctx, &d, KVA_STATUS_OUT_OF_RANGE, "query_start_loc[1] = 1073741825");
        }
#undef WITH
        kva_context_destroy(ctx);
    }
}

static void test_get_info_errors(void)
{
    kva_plan_info info;
    memset(&info, 0xab, sizeof info);
    kva_plan_info copy = info;
    CHECK_STATUS(kva_plan_get_info(NULL, &info), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("plan");
    CHECK(memcmp(&info, &copy, sizeof info) == 0);
    kva_context *ctx = make_ctx(KVA_BACKEND_REF);
    const int32_t q[1] = {1}, s[1] = {1};
    test_batch b;
    make_batch(&b, 1, q, s, 0);
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &b.d, &plan));
    CHECK_STATUS(kva_plan_get_info(plan, NULL), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("out");
    kva_plan_destroy(plan);
    kva_context_destroy(ctx);
}

/* ---- the backend hooks ---- */

/* A fake backend whose plan_build allocates a partition and reserves workspace,
 * failing for H == 16 after allocating; plan_release frees it and counts calls. */
static int g_builds, g_releases;

static kva_status fake_build(kva_context *ctx, kva_plan *plan)
{
    g_builds++;
    plan->part = malloc(32);
    plan->workspace_bytes = 4096;
    plan->info.num_work_items = 7;
    if (plan->d.num_heads == 16)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "fake_build: refusing num_heads = 16");
    return kva__context_reserve_workspace(ctx, plan->workspace_bytes);
}

static void fake_release(kva_plan *plan)
{
    g_releases++;
    free(plan->part);
    plan->part = NULL;
}

static const kva__backend_ops kFakeOps = {.name = "fake",
                                          .plan_build = fake_build,
                                          .plan_release = fake_release,
                                          .memory = &kva__host_memory};

static void test_backend_hooks(void)
{
    kva_context *ctx = make_ctx(KVA_BACKEND_REF);
    const kva__backend_ops *real = ctx->ops;
    ctx->ops = &kFakeOps;
    const int32_t q[2] = {1, 5}, s[2] = {9, 5};
    test_batch b;
    make_batch(&b, 2, q, s, 0);
    g_builds = g_releases = 0;
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &b.d, &plan));
    CHECK(g_builds == 1 && g_releases == 0);
    if (plan) {
        CHECK(plan->part != NULL && plan->info.num_work_items == 7);
        CHECK(ctx->workspace_bytes >= plan->workspace_bytes);
        /* The builder saw the resolved scalars and the copies. */
        CHECK(plan->d.scale > 0.0f && plan->d.decode_threshold == 1);
        CHECK(plan->info.state == KVA_STATE_CHUNKED_PREFILL);
    }
    /* The plan remembers its backend table: destroy releases the partition even
     * after the context switched tables (ASan checks the free). */
    ctx->ops = real;
    kva_plan_destroy(plan);
    CHECK(g_releases == 1);

    /* A failing build: its status and message come through, the partial
     * partition is released, nothing leaks, *out is unchanged. */
    ctx->ops = &kFakeOps;
    b.d.num_heads = 16;
    EXPECT_BAD(ctx, &b.d, KVA_STATUS_OUT_OF_MEMORY, "refusing num_heads = 16");
    CHECK(g_builds == 2 && g_releases == 2);
    /* Invalid metadata never reaches the backend. */
    b.d.num_heads = 0;
    EXPECT_BAD(ctx, &b.d, KVA_STATUS_INVALID_ARGUMENT, "num_heads");
    CHECK(g_builds == 2);
    ctx->ops = real;
    kva_context_destroy(ctx);
}

/* ---- decode-first reordering ---- */

static void test_reorder_random(void)
{
    kva_rng rng = {20240611u};
    for (int iter = 0; iter < 200; iter++) {
        int32_t R = kva_rng_int(&rng, 0, MAX_R);
        int32_t thr = kva_rng_int(&rng, 0, 4);
        int32_t q[MAX_R], perm[MAX_R], want[MAX_R];
        for (int32_t r = 0; r < R; r++)
            q[r] = kva_rng_unit(&rng) < 0.5 ? kva_rng_int(&rng, 0, 5) : kva_rng_int(&rng, 1, 300);
        for (int32_t r = 0; r < MAX_R; r++)
            perm[r] = -7;
        /* Independent computation: insertion sort of indices by the key
         * "is a prefill", which is stable because it moves only strictly greater keys. */
        int32_t eff = thr == 0 ? 1 : thr;
        for (int32_t r = 0; r < R; r++) {
            int32_t i = r;
            while (i > 0 && q[want[i - 1]] > eff && !(q[r] > eff)) {
                want[i] = want[i - 1];
                i--;
            }
            want[i] = r;
        }
        int32_t want_nd = 0;
        for (int32_t r = 0; r < R; r++)
            want_nd += q[r] <= eff;
        int32_t nd = -1;
        CHECK_OK(kva_batch_reorder_decode_first(R, q, thr, perm, &nd));
        CHECK_MSG(nd == want_nd, "iter %d: num_decodes %d want %d", iter, nd, want_nd);
        CHECK(memcmp(perm, want, (size_t)R * sizeof(int32_t)) == 0);
        for (int32_t r = R; r < MAX_R; r++)
            CHECK(perm[r] == -7); /* nothing past R written */
        /* num_decodes may be NULL. */
        CHECK_OK(kva_batch_reorder_decode_first(R, q, thr, perm, NULL));
        CHECK(memcmp(perm, want, (size_t)R * sizeof(int32_t)) == 0);
    }
}

static void test_reorder_errors(void)
{
    int32_t q[4] = {5, 1, 2, 1};
    int32_t perm[4] = {9, 9, 9, 9};
    const int32_t untouched[4] = {9, 9, 9, 9};
    int32_t nd = 42;
    /* A fixed example: {5, 1, 2, 1} with threshold 2 -> decodes 1, 2, 3, then 0. */
    CHECK_OK(kva_batch_reorder_decode_first(4, q, 2, perm, &nd));
    CHECK(perm[0] == 1 && perm[1] == 2 && perm[2] == 3 && perm[3] == 0 && nd == 3);
    memcpy(perm, untouched, sizeof perm);
    nd = 42;

    CHECK_STATUS(kva_batch_reorder_decode_first(-1, q, 0, perm, &nd), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("num_requests");
    CHECK_STATUS(kva_batch_reorder_decode_first(4, NULL, 0, perm, &nd), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("q_lens");
    CHECK_STATUS(kva_batch_reorder_decode_first(4, q, 0, NULL, &nd), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("perm");
    CHECK_STATUS(kva_batch_reorder_decode_first(4, q, -2, perm, &nd), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("decode_threshold");
    q[3] = -1;
    CHECK_STATUS(kva_batch_reorder_decode_first(4, q, 0, perm, &nd), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("q_lens[3]");
    CHECK(memcmp(perm, untouched, sizeof perm) == 0);
    CHECK(nd == 42);
    /* R == 0 needs no arrays. */
    CHECK_OK(kva_batch_reorder_decode_first(0, NULL, 0, NULL, &nd));
    CHECK(nd == 0);
}

int main(void)
{
    RUN(test_classify);
    RUN(test_state_names);
    RUN(test_copies_independent);
    RUN(test_max_block_id);
    RUN(test_bad_inputs);
    RUN(test_block_scan);
    RUN(test_get_info_errors);
    RUN(test_backend_hooks);
    RUN(test_reorder_random);
    RUN(test_reorder_errors);
    return kva_test_finish();
}
