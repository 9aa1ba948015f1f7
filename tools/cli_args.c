/* cli_args.c - strict parsing of command-line values for the kvattn tool. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kva_cli_flag_is(const char *arg, const char *flag)
{
    size_t n = strlen(flag);
    return strncmp(arg, flag, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

const char *kva_cli_flag_value(int argc, char **argv, int *i, const char *flag)
{
    const char *arg = argv[*i];
    size_t n = strlen(flag);
    if (arg[n] == '=')
        return arg + n + 1;
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvattn: %s needs a value\n", flag);
        return NULL;
    }
    *i += 1;
    return argv[*i];
}

static size_t digits(const char *s)
{
    size_t n = 0;
    while (s[n] >= '0' && s[n] <= '9')
        n++;
    return n;
}

size_t kva_cli_number_len(const char *s, int frac)
{
    size_t n = s[0] == '-';
    size_t whole = digits(s + n), part = 0;
    n += whole;
    if (frac && s[n] == '.') {
        part = digits(s + n + 1);
        if (whole + part > 0)
            n += 1 + part;
    }
    if (whole + part == 0)
        return 0;
    if (frac && (s[n] == 'e' || s[n] == 'E')) {
        size_t e = n + 1 + (s[n + 1] == '+' || s[n + 1] == '-');
        size_t ed = digits(s + e);
        if (ed > 0)
            n = e + ed;
    }
    return n;
}

const char *kva_cli_flag_split(int argc, char **argv, int *i, char *name, size_t cap,
                               const char *cmd, const char *const *flags, size_t nflags)
{
    const size_t n = strcspn(argv[*i], "=");
    snprintf(name, cap, "%.*s", (int)(n < cap ? n : cap - 1), argv[*i]);
    size_t k = 0;
    while (k < nflags && strcmp(name, flags[k]) != 0)
        k++;
    if (k == nflags || n >= cap) { /* checked before the value: "--x" last is unknown */
        fprintf(stderr, "kvattn: %s: unknown option '%s'\n", cmd, argv[*i]);
        return NULL;
    }
    return kva_cli_flag_value(argc, argv, i, name);
}

int kva_cli_parse_i32(const char *flag, const char *s, int32_t lo, int32_t hi, int32_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || kva_cli_number_len(s, 0) != strlen(s) || *end != '\0' || errno == ERANGE) {
        fprintf(stderr, "kvattn: %s: '%s' is not an integer\n", flag, s);
        return 0;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "kvattn: %s: %lld is out of range [%ld, %ld]\n", flag, v, (long)lo,
                (long)hi);
        return 0;
    }
    *out = (int32_t)v;
    return 1;
}

int kva_cli_parse_u64(const char *flag, const char *s, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    if (*s == '-' || *s == '\0' || kva_cli_number_len(s, 0) != strlen(s)) {
        fprintf(stderr, "kvattn: %s: '%s' is not a non-negative integer\n", flag, s);
        return 0;
    }
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0' || errno == ERANGE) {
        fprintf(stderr, "kvattn: %s: '%s' is not a non-negative integer\n", flag, s);
        return 0;
    }
    *out = (uint64_t)v;
    return 1;
}

int kva_cli_parse_double(const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    /* ERANGE on underflow (|v| below DBL_MIN: 1e-320, 1e-400) is a value
     * rounded towards 0, not an error; on overflow v is +-HUGE_VAL. */
    if (!*s || kva_cli_number_len(s, 1) != strlen(s) || *end != '\0' ||
        (errno == ERANGE && fabs(v) > 1.0) || !isfinite(v)) {
        fprintf(stderr, "kvattn: %s: '%s' is not a finite number\n", flag, s);
        return 0;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "kvattn: %s: %g is out of range [%g, %g]\n", flag, v, lo, hi);
        return 0;
    }
    *out = v;
    return 1;
}

int kva_cli_parse_float(const char *flag, const char *s, float lo, float hi, float *out)
{
    double v = 0.0;
    if (!kva_cli_parse_double(flag, s, (double)lo, (double)hi, &v))
        return 0;
    *out = (float)v;
    return 1;
}

int kva_cli_parse_choice(const char *flag, const char *s, const char *const *names, int n, int *out)
{
    for (int k = 0; k < n; k++) {
        if (strcmp(s, names[k]) == 0) {
            *out = k;
            return 1;
        }
    }
    fprintf(stderr, "kvattn: %s: '%s' is not one of:", flag, s);
    for (int k = 0; k < n; k++)
        fprintf(stderr, " %s", names[k]);
    fputc('\n', stderr);
    return 0;
}

int kva_cli_lib_error(const char *what, kva_status st)
{
    fprintf(stderr, "kvattn: %s failed: %s: %s\n", what, kva_status_name(st), kva_last_error());
    return KVA_EXIT_LIBRARY;
}
