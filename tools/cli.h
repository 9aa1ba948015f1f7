/*
 * cli.h - declarations shared by the files of the `kvattn` command-line tool.
 *
 * Exit statuses of every subcommand: KVA_EXIT_OK on success, KVA_EXIT_LIBRARY
 * when a kvattn call fails (or a correctness check fails), KVA_EXIT_USAGE for
 * an unknown flag or a bad value.
 */
#ifndef KVA_CLI_H
#define KVA_CLI_H

#include "kvattn.h"

#include <stddef.h>
#include <stdint.h>

enum { KVA_EXIT_OK = 0, KVA_EXIT_LIBRARY = 1, KVA_EXIT_USAGE = 2 };

/* ---- subcommands (one file each) ---- */

int kva_cli_info(int argc, char **argv);             /* cmd_info.c */
int kva_cli_bench(int argc, char **argv);            /* cmd_bench.c */
int kva_cli_bench_dcp(int argc, char **argv);        /* bench_dcp.c: kvattn bench --dcp N */
void kva_cli_usage_bench(void);                      /* cmd_bench.c: the bench options */
int kva_cli_bench_mla(int argc, char **argv);        /* bench_mla.c: kvattn bench --mla */
int kva_cli_bench_mla_sparse(int argc, char **argv); /* bench_mla_sparse.c: --mla-sparse */
int kva_cli_bench_indexer(int argc, char **argv);    /* bench_indexer.c: --indexer */
/* bench_cascade.c: kvattn bench --cascade */
int kva_cli_bench_cascade(int argc, char **argv);
int kva_cli_serve_sim(int argc, char **argv); /* cmd_serve_sim.c */
void kva_cli_usage_serve_sim(void);           /* cmd_serve_sim.c: the serve-sim options */

/* ---- argument parsing (cli_args.c) ---- */

/* A number on the command line (docs/cli.md) is an optional '-' and decimal
 * digits; where frac is set, also a fraction (".5", "2.", "2.5") and an
 * exponent ("1e-3"). Nothing else: no space, '+', hex, octal, inf or nan.
 * Returns the length of the longest number at the start of s, 0 if none. */
size_t kva_cli_number_len(const char *s, int frac);
/* Each parser converts the whole string (a number as above) or prints
 * "kvattn: <flag>: ..." to stderr and returns 0; on success it stores the
 * value and returns 1. kva_cli_parse_u64 takes no '-'. */
int kva_cli_parse_i32(const char *flag, const char *s, int32_t lo, int32_t hi, int32_t *out);
int kva_cli_parse_u64(const char *flag, const char *s, uint64_t *out);
int kva_cli_parse_float(const char *flag, const char *s, float lo, float hi, float *out);
int kva_cli_parse_double(const char *flag, const char *s, double lo, double hi, double *out);
/* Matches s against names[0..n); stores the index. */
int kva_cli_parse_choice(const char *flag, const char *s, const char *const *names, int n,
                         int *out);
/* Returns the value of a flag that needs one (argv[*i + 1]) and advances *i,
 * or prints "missing value" and returns NULL. Accepts "--flag=value" too: then
 * the value is the part after '=' and *i is not advanced. */
const char *kva_cli_flag_value(int argc, char **argv, int *i, const char *flag);
/* For a flag that needs a value: copies argv[*i] up to any '=' into name
 * [cap]; a name not in flags[0..nflags) (cmd's value flags) is "kvattn: cmd:
 * unknown option" and NULL, checked before the value, so that an unknown
 * flag last on the line is not "needs a value". Otherwise returns
 * kva_cli_flag_value(argc, argv, i, name) (NULL with a message when the value
 * is missing). The sub-benchmarks' parsers use it. */
const char *kva_cli_flag_split(int argc, char **argv, int *i, char *name, size_t cap,
                               const char *cmd, const char *const *flags, size_t nflags);
/* 1 if argv[i] is flag or starts with "flag=". */
int kva_cli_flag_is(const char *arg, const char *flag);

/* Prints "kvattn: <what> failed: KVA_STATUS_X: <kva_last_error()>" to stderr
 * and returns KVA_EXIT_LIBRARY. */
int kva_cli_lib_error(const char *what, kva_status st);

/* ---- benchmark buffers (cli_buf.c) ---- */

/* n bytes (at least 1) on GPU 0 (dev, CUDA builds) or the host; NULL when
 * out of memory. */
void *kva_cli_buf_new(int dev, size_t n);
void kva_cli_buf_free(int dev, void *p);
/* Copies n bytes between the host and a kva_cli_buf_new(dev) buffer, either
 * way (after the work queued before it); KVA_EXIT_LIBRARY with a message on a
 * device error, else KVA_EXIT_OK. */
int kva_cli_buf_copy(int dev, void *dst, const void *src, size_t n);

/* ---- timing and machine (cli_sys.c) ---- */

/* Monotonic clock in seconds (clock_gettime CLOCK_MONOTONIC). */
double kva_cli_now(void);
/* Measured memory read bandwidth in GB/s of this machine with the given
 * number of threads (best of a few passes over a buffer much larger than the
 * last-level cache); 0 if it cannot be measured. */
double kva_cli_measure_read_bw(int num_threads);
/* One read pass at a time over that buffer, for measurements interleaved
 * with the timed runs (`kvattn bench --paired`): open allocates and touches
 * it (-1: out of memory), pass reads it once with the reader's threads and
 * returns GB/s, close frees it. kva_cli_reader_open_bytes takes the buffer's
 * size instead: a buffer as large as a kernel's working set, read pass after
 * pass, measures the memory level that kernel re-reads it from (the last-level
 * cache when it fits there). */
typedef struct kva_cli_reader {
    uint64_t *buf;
    size_t words;
    int threads;
} kva_cli_reader;
int kva_cli_reader_open(kva_cli_reader *r, int num_threads);
int kva_cli_reader_open_bytes(kva_cli_reader *r, int num_threads, size_t bytes);
double kva_cli_reader_pass(kva_cli_reader *r);
void kva_cli_reader_close(kva_cli_reader *r);
/* Measured fp32 FMA peak in GFLOP/s with the given number of threads, using
 * the widest vector FMA this CPU and OS support (cli_peak.c); *isa receives
 * its name ("avx512", "avx2+fma", "scalar"). */
double kva_cli_measure_fma_peak(int num_threads, const char **isa);

#endif /* KVA_CLI_H */
