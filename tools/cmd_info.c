/* cmd_info.c - `kvattn info`: what this build of kvattn can run on this machine. */
#include "cli.h"
#include "internal.h" /* kva__cpu_isa_string, kva__context_kernels, kva__backend_device_count */

#include <stdio.h>
#include <string.h>

static void usage_info(FILE *f)
{
    fprintf(f, "usage: kvattn info\n"
               "Prints the library version, each backend and whether it is available,\n"
               "the CPU vector ISA detected at run time, the CPU backend's default thread\n"
               "count and the number of CUDA devices visible.\n");
}

int kva_cli_info(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage_info(stdout);
            return KVA_EXIT_OK;
        }
        fprintf(stderr, "kvattn info: unknown option '%s'\n", argv[i]);
        usage_info(stderr);
        return KVA_EXIT_USAGE;
    }

    printf("%-14s %s\n", "version", kva_version());
    printf("%-14s", "backends");
    for (int b = 0; b < KVA_BACKEND_COUNT_; b++)
        printf(" %s (%s)", kva_backend_name((kva_backend)b),
               kva_backend_available((kva_backend)b) ? "available" : "unavailable");
    printf("\n");
    printf("%-14s %s\n", "cpu isa", kva__cpu_isa_string());
    printf("%-14s %s (KVA_CPU_ISA lowers it)\n", "cpu kernels",
           kva__cpu_isa_name(kva__cpu_isa_level()));

    /* A default context (CPU backend, all cores) reports the thread count and
     * the kernel registry (`kvattn bench --variant NAME` forces one). */
    kva_context *ctx = NULL;
    kva_status st = kva_context_create(NULL, &ctx);
    if (st != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_context_create", st);
    int32_t nk = 0;
    const kva__kernel_info *k = kva__context_kernels(ctx, &nk);
    for (int32_t i = 0; i < nk; i++)
        printf("%-14s %s%s\n", "", k[i].name,
               !k[i].usable || k[i].usable(ctx) ? "" : " (not supported here)");
    printf("%-14s %d\n", "cpu threads", (int)kva_context_num_threads(ctx));
    kva_context_destroy(ctx);

    printf("%-14s %d\n", "cuda devices", kva__backend_device_count(KVA_BACKEND_CUDA));
    return KVA_EXIT_OK;
}
