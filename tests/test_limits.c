/* The size limits of every input reader at their edge (docs/LIMITS.md,
 * "Files and lines"): an input of exactly the limit is read, one byte (or
 * one entry) more is refused with VP_ELIMIT and a message that names the
 * limit. Each input is a real one (a shipped profile, config or raw
 * calibration) padded with what its format ignores: a YAML comment, JSON
 * whitespace, blank lines. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vramplan/api.h"
#include "vramplan/batching.h"
#include "vramplan/gpu.h"
#include "vramplan/kvcache.h"
#include "vramplan/validate.h"

#define KiB 1024u
#define MiB (1024u * 1024u)

/* path's text followed by filler up to exactly n bytes: `open` once, then
 * `fill` (a YAML comment: "#", "x"...; JSON: " "; lines: "\n") up to the
 * last byte, then `last`. */
static char *padded(const char *path, size_t n, const char *open, char fill,
                    char last)
{
    FILE *f = fopen(path, "rb");
    char *buf = malloc(n + 1);
    size_t len;

    cr_assert_not_null(f, "cannot open %s", path);
    cr_assert_not_null(buf);
    len = fread(buf, 1, n, f);
    fclose(f);
    cr_assert_lt(len + strlen(open) + 1, n, "%s is too long to pad", path);
    memcpy(buf + len, open, strlen(open));
    len += strlen(open);
    memset(buf + len, fill, n - 1 - len);
    buf[n - 1] = last;
    buf[n] = '\0';
    return buf;
}

static void expect_limit(vp_status st, const vp_error *err, const char *what)
{
    cr_expect_eq(st, VP_ELIMIT, "status %d: %s", (int)st, err->msg);
    cr_expect_not_null(strstr(err->msg, what), "'%s' does not name %s",
                       err->msg, what);
}

/* ---- GPU profiles: 1 MiB, 32 entries a list ------------------------- */

#define PROFILE "gpus/h200.yaml"

Test(limits, gpu_profile_of_exactly_1_mib_loads)
{
    char *buf = padded(PROFILE, MiB, "\n#", 'x', '\n');
    vp_error err;
    vp_gpu_profile *p = vp_gpu_parse_buf(buf, MiB, "p.yaml", &err);

    cr_assert_not_null(p, "%s", err.msg);
    cr_expect_str_eq(vp_gpu_name(p), "h200");
    vp_gpu_free(p);
    free(buf);
}

Test(limits, gpu_profile_one_byte_over_1_mib_is_refused)
{
    char *buf = padded(PROFILE, MiB + 1, "\n#", 'x', '\n');
    vp_error err;

    cr_expect_null(vp_gpu_parse_buf(buf, MiB + 1, "p.yaml", &err));
    expect_limit(err.code, &err, "at most 1048576 bytes");
    free(buf);
}

/* The profile with its device_names line replaced by a list of n. */
static vp_gpu_profile *with_names(size_t n, vp_error *err)
{
    char *buf = padded(PROFILE, 64 * KiB, "\n", ' ', '\n');
    char *text = malloc(64 * KiB + 32 * n + 64), *at, *end;
    vp_gpu_profile *p;
    size_t k;

    cr_assert_not_null(text);
    at = strstr(buf, "\ndevice_names:");
    cr_assert_not_null(at);
    end = strchr(at + 1, '\n');
    k = (size_t)(at + 1 - buf);
    memcpy(text, buf, k);
    k += (size_t)sprintf(text + k, "device_names: [");
    for (size_t i = 0; i < n; i++)
        k += (size_t)sprintf(text + k, "%s\"GPU %zu\"", i ? ", " : "", i);
    k += (size_t)sprintf(text + k, "]");
    strcpy(text + k, end);
    p = vp_gpu_parse_buf(text, strlen(text), "p.yaml", err);
    free(text);
    free(buf);
    return p;
}

Test(limits, gpu_profile_list_of_32_loads)
{
    vp_error err;
    vp_gpu_profile *p = with_names(32, &err);

    cr_assert_not_null(p, "%s", err.msg);
    vp_gpu_free(p);
}

Test(limits, gpu_profile_list_of_33_is_refused)
{
    vp_error err;

    cr_expect_null(with_names(33, &err));
    expect_limit(err.code, &err, "more than 32 entries");
}

/* ---- Hugging Face config.json (serve, batching): 4 MiB -------------- */

#define CONFIG "tests/data/hf/gpt2-medium.json"

Test(limits, config_of_exactly_4_mib_loads)
{
    char *buf = padded(CONFIG, 4 * MiB, "", ' ', '\n');
    vp_kv_layout kv;
    vp_error err;

    cr_expect_eq(vp_kv_layout_from_hf_buf(buf, 4 * MiB, "c.json", &kv, &err),
                 VP_OK, "%s", err.msg);
    cr_expect_eq(kv.n_layers, 24, "gpt2-medium's layers");
    vp_kv_layout_destroy(&kv);
    free(buf);
}

Test(limits, config_one_byte_over_4_mib_is_refused)
{
    char *buf = padded(CONFIG, 4 * MiB + 1, "", ' ', '\n');
    vp_kv_layout kv;
    vp_error err;

    expect_limit(vp_kv_layout_from_hf_buf(buf, 4 * MiB + 1, "c.json", &kv,
                                          &err),
                 &err, "at most 4194304 bytes");
    free(buf);
}

/* ---- raw calibration output (calibrate --from-raw): 16 MiB ---------- */

#define RAW "tests/data/gpu/h200-raw.jsonl"

Test(limits, raw_calibration_of_exactly_16_mib_loads)
{
    char *buf = padded(RAW, 16 * MiB, "", '\n', '\n');
    vp_error err;
    vp_calib *c = vp_calib_parse(buf, 16 * MiB, "r.jsonl", &err);

    cr_assert_not_null(c, "%s:%u: %s", err.path, err.line, err.msg);
    vp_calib_free(c);
    free(buf);
}

Test(limits, raw_calibration_one_byte_over_16_mib_is_refused)
{
    char *buf = padded(RAW, 16 * MiB + 1, "", '\n', '\n');
    vp_error err;

    cr_expect_null(vp_calib_parse(buf, 16 * MiB + 1, "r.jsonl", &err));
    expect_limit(err.code, &err, "over 16777216 bytes");
    free(buf);
}

/* ---- lengths files (batching, serve --lengths) ----------------------- */

static vp_status lengths(const char *text, size_t len, vp_lengths *l,
                         vp_error *err)
{
    vp_status st = vp_lengths_parse(text, len, "l.txt", l, err);

    if (st == VP_OK)
        vp_lengths_destroy(l);
    return st;
}

Test(limits, lengths_file_of_exactly_64_mib_loads)
{
    size_t n = VP_LENGTHS_MAX_BYTES;
    char *buf = malloc(n + 1);
    vp_lengths l;
    vp_error err;

    cr_assert_not_null(buf);
    memset(buf, '\n', n);
    memcpy(buf, "512\n", 4);
    cr_expect_eq(vp_lengths_parse(buf, n, "l.txt", &l, &err), VP_OK, "%s",
                 err.msg);
    cr_expect_eq(l.sequences, 1);
    vp_lengths_destroy(&l);
    memset(buf, '\n', n + 1);
    memcpy(buf, "512\n", 4);
    expect_limit(lengths(buf, n + 1, &l, &err), &err,
                 "at most 67108864 bytes");
    free(buf);
}

Test(limits, a_length_of_2_pow_24_tokens_is_the_longest)
{
    vp_lengths l;
    vp_error err;

    cr_expect_eq(lengths("16777216\n", 9, &l, &err), VP_OK, "%s", err.msg);
    cr_expect_neq(lengths("16777217\n", 9, &l, &err), VP_OK);
    cr_expect_not_null(strstr(err.msg, "16777216"), "%s", err.msg);
}

Test(limits, a_histogram_of_2_pow_40_sequences_is_the_largest)
{
    const char *at = "100 1099511627776\n", *over = "100 1099511627777\n",
               *sum = "100 1099511627775\n200 2\n";
    vp_lengths l;
    vp_error err;

    cr_expect_eq(lengths(at, strlen(at), &l, &err), VP_OK, "%s", err.msg);
    cr_expect_neq(lengths(over, strlen(over), &l, &err), VP_OK);
    cr_expect_not_null(strstr(err.msg, "1099511627776"), "%s", err.msg);
    expect_limit(lengths(sum, strlen(sum), &l, &err), &err,
                 "more than 2^40 sequences");
    cr_expect_eq(err.line, 2, "the line that passes the total");
}

/* A histogram of n distinct lengths 1..n, one sequence each. */
static vp_status distinct(size_t n, vp_error *err)
{
    char *buf = malloc(n * 12 + 1);
    size_t k = 0;
    vp_lengths l;
    vp_status st;

    cr_assert_not_null(buf);
    for (size_t i = 1; i <= n; i++)
        k += (size_t)sprintf(buf + k, "%zu 1\n", i);
    st = lengths(buf, k, &l, err);
    free(buf);
    return st;
}

Test(limits, a_million_distinct_lengths_is_the_most)
{
    vp_error err;

    cr_expect_eq(distinct(VP_LENGTHS_MAX_DISTINCT, &err), VP_OK, "%s",
                 err.msg);
    expect_limit(distinct(VP_LENGTHS_MAX_DISTINCT + 1, &err), &err,
                 "more than 1000000 distinct lengths");
}

/* ---- the JSON API (Python bindings): 1 MiB a request ---------------- */

static vp_status api(size_t n, vp_error *err)
{
    const char *req = "{\"command\": \"estimate\", \"model\": "
                      "\"tests/data/good/graph-blocks.yaml\"}";
    char *buf = malloc(n + 1), *resp = NULL;
    vp_status st;

    cr_assert_not_null(buf);
    memset(buf, ' ', n);
    memcpy(buf, req, strlen(req));
    buf[n] = '\0';
    st = vp_api_call(buf, &resp, err);
    if (st == VP_OK)
        cr_expect_not_null(strstr(resp, "\"peak_alloc\""), "%s", resp);
    vp_api_free(resp);
    free(buf);
    return st;
}

Test(limits, api_request_of_exactly_1_mib_runs)
{
    vp_error err;

    cr_expect_eq(api(VP_API_MAX_REQUEST, &err), VP_OK, "%s", err.msg);
}

Test(limits, api_request_one_byte_over_1_mib_is_refused)
{
    vp_error err;

    expect_limit(api(VP_API_MAX_REQUEST + 1, &err), &err,
                 "at most 1048576 bytes (VP_API_MAX_REQUEST)");
}

/* ---- ground-truth JSONL (validate, fit): 1 MiB a line ---------------- */

/* A file of an env line and a line of n bytes (a JSON object padded with
 * spaces); what vp_gt_next says of the second line. */
static vp_status jsonl_line(size_t n, size_t *len, vp_error *err)
{
    char path[] = "/tmp/vp-limit-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    const char *json;
    uint32_t line;
    vp_gt_file *g;
    vp_status st;
    bool end;

    cr_assert_not_null(f);
    fputs("{\"env\": {}}\n{\"id\": \"x\"}", f);
    for (size_t i = strlen("{\"id\": \"x\"}"); i < n; i++)
        fputc(' ', f);
    fputc('\n', f);
    cr_assert_eq(fclose(f), 0);
    g = vp_gt_open(path, err);
    cr_assert_not_null(g, "%s", err->msg);
    do /* the env line may be read by vp_gt_open */
        st = vp_gt_next(g, &json, len, &line, &end, err);
    while (st == VP_OK && !end && line < 2);
    cr_assert(!end);
    vp_gt_close(g);
    unlink(path);
    return st;
}

Test(limits, jsonl_line_of_exactly_1_mib_is_read)
{
    size_t len = 0;
    vp_error err;

    cr_expect_eq(jsonl_line(VP_VALIDATE_MAX_LINE, &len, &err), VP_OK, "%s",
                 err.msg);
    cr_expect_eq(len, VP_VALIDATE_MAX_LINE);
}

Test(limits, jsonl_line_one_byte_over_1_mib_is_refused)
{
    size_t len = 0;
    vp_error err;

    expect_limit(jsonl_line(VP_VALIDATE_MAX_LINE + 1, &len, &err), &err,
                 "line longer than 1048576 bytes");
    cr_expect_eq(err.line, 2);
}

/* ---- outlier bounds (validate --outliers): 1 MiB --------------------- */

static vp_status bounds(size_t n, vp_error *err)
{
    const char *text = "{\"tolerance\": 0.25, \"files\": []}";
    char path[] = "/tmp/vp-limit-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    vp_bounds b;
    vp_status st;

    cr_assert_not_null(f);
    fputs(text, f);
    for (size_t i = strlen(text); i < n; i++)
        fputc(i + 1 == n ? '\n' : ' ', f);
    cr_assert_eq(fclose(f), 0);
    st = vp_bounds_load(path, &b, err);
    if (st == VP_OK)
        vp_bounds_destroy(&b);
    unlink(path);
    return st;
}

Test(limits, bounds_file_of_exactly_1_mib_loads)
{
    vp_error err;

    cr_expect_eq(bounds(MiB, &err), VP_OK, "%s", err.msg);
}

Test(limits, bounds_file_one_byte_over_1_mib_is_refused)
{
    vp_error err;

    expect_limit(bounds(MiB + 1, &err), &err, "at most 1048576 bytes");
}
