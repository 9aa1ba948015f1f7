/*
 * main.c - the `kvattn` command-line tool: subcommand dispatch and usage.
 *
 *   kvattn info       library version, backends, CPU ISA, threads, CUDA devices
 *   kvattn bench      check one attention shape against the reference, then time it
 *   kvattn serve-sim  serving simulation: scheduler + block pool + L layers, vllm bench serve's
 * table
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvattn <command> [options]\n"
            "\n"
            "kvattn %s - paged KV cache attention backends for LLM serving.\n"
            "\n"
            "commands:\n"
            "  info           library version, backends, CPU ISA, threads, CUDA devices\n"
            "  bench          check one attention shape against the reference backend, then\n"
            "                 time it (median and min), with GB/s and GFLOP/s\n"
            "  serve-sim      simulate a serving workload on the library (scheduler, block\n"
            "                 pool with prefix caching, L layers) and print vllm bench\n"
            "                 serve's result table\n"
            "  help           this message (also: --help, -h, or no arguments)\n"
            "\n"
            "Run `kvattn bench --help` or `kvattn serve-sim --help` for their options.\n"
            "Exit status: 0 success, 1 library error or failed check, 2 bad usage.\n",
            kva_version());
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stdout);
        return KVA_EXIT_OK;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        if (argc >= 3 && strcmp(argv[2], "bench") == 0)
            kva_cli_usage_bench();
        else if (argc >= 3 && strcmp(argv[2], "serve-sim") == 0)
            kva_cli_usage_serve_sim();
        else
            usage(stdout);
        return KVA_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("kvattn %s\n", kva_version());
        return KVA_EXIT_OK;
    }
    if (strcmp(cmd, "info") == 0)
        return kva_cli_info(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0)
        return kva_cli_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "serve-sim") == 0)
        return kva_cli_serve_sim(argc - 1, argv + 1);
    fprintf(stderr, "kvattn: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return KVA_EXIT_USAGE;
}
