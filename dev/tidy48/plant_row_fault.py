#!/usr/bin/env python3
"""plant_row_fault.py - tidy48's planted fault for the two-run comparisons of
tests/test_cache_interleaved.c and tests/test_api_blackbox_masks.c. Run from
the tree root; it patches src/attn/api.c (undo with git checkout
src/attn/api.c): kva_attention_run then leaves the last token's out row
(environment TIDY48_FAULT_OUT set) or, for cascade plans, its lse row
(TIDY48_FAULT_LSE) as it was before the call, on the host backends - what a
kernel that skips the row does. Results: dev/tidy48/README.md."""
p='src/attn/api.c'
s=open(p).read()
a='''    if (plan->cascade)
        return kva__cascade_run(ctx, plan, q, cache, sinks, out, lse);
    return ctx->ops->attention_paged(ctx, plan, q, cache, sinks, out, lse);
}
'''
b='''    /* TIDY48 PLANTED FAULT: the last token's out row (TIDY48_FAULT_OUT) or lse
     * row (TIDY48_FAULT_LSE, cascade plans only) left as it was before the call. */
    const int64_t fT = plan->info.num_tokens, fH = plan->d.num_heads, fDv = plan->d.head_dim_v;
    const size_t frow = (size_t)(fH * fDv) * kva_dtype_size(plan->d.q_dtype);
    static unsigned char fsave[1 << 16];
    static float flse[4096];
    const int fo = getenv("TIDY48_FAULT_OUT") && fT > 0 && frow <= sizeof fsave;
    const int fl = getenv("TIDY48_FAULT_LSE") && plan->cascade && lse && fT > 0 && fH <= 4096;
    if (fo)
        memcpy(fsave, (char *)out + (size_t)(fT - 1) * frow, frow);
    if (fl)
        memcpy(flse, lse + (fT - 1) * fH, (size_t)fH * 4);
    kva_status fst = plan->cascade ? kva__cascade_run(ctx, plan, q, cache, sinks, out, lse)
                                   : ctx->ops->attention_paged(ctx, plan, q, cache, sinks, out, lse);
    if (fo)
        memcpy((char *)out + (size_t)(fT - 1) * frow, fsave, frow);
    if (fl)
        memcpy(lse + (fT - 1) * fH, flse, (size_t)fH * 4);
    return fst;
}
'''
assert s.count(a)==1
s=s.replace(a,b)
if True:
    s=s.replace("#include \"internal.h\"", "#include \"internal.h\"\n#include <stdlib.h>\n#include <string.h>", 1)
open(p,'w').write(s)
