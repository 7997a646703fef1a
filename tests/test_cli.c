/* Tests of the vramplan command line against golden files.
 *
 * Each case runs the binary (VRAMPLAN_BIN, default ./vramplan, from the
 * repository root) and compares its stdout with tests/golden/NAME.out, its
 * stderr with tests/golden/NAME.err and its exit status with the expected
 * one. Run with VRAMPLAN_UPDATE_GOLDEN=1 to rewrite the golden files from
 * the current output (then review the diff). */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "vramplan/vramplan.h"

#define GOLDEN_DIR "tests/golden/"
#define MAX_ARGS 32

typedef struct cli_run {
    char *out;  /* stdout, NUL-terminated; free()                      */
    char *err;  /* stderr                                              */
    int status; /* exit status, or 128 + the signal that killed it     */
} cli_run;

static const char *cli_bin(void)
{
    const char *bin = getenv("VRAMPLAN_BIN");

    return bin != NULL && bin[0] != '\0' ? bin : "./vramplan";
}

static bool update_golden(void)
{
    const char *u = getenv("VRAMPLAN_UPDATE_GOLDEN");

    return u != NULL && u[0] != '\0' && strcmp(u, "0") != 0;
}

/* The whole content of f from its start. */
static char *slurp(FILE *f)
{
    size_t len = 0, cap = 4096, n;
    char *buf = malloc(cap), *grown;

    cr_assert_not_null(buf);
    rewind(f);
    while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len - 1 == 0) {
            grown = realloc(buf, cap * 2);
            cr_assert_not_null(grown);
            buf = grown;
            cap *= 2;
        }
    }
    cr_assert_not(ferror(f));
    buf[len] = '\0';
    return buf;
}

/* The file's content, or NULL when it does not exist. */
static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *text;

    if (f == NULL) {
        cr_assert_eq(errno, ENOENT, "cannot read %s: %s", path,
                     strerror(errno));
        return NULL;
    }
    text = slurp(f);
    fclose(f);
    return text;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");

    cr_assert_not_null(f, "cannot write %s: %s", path, strerror(errno));
    fputs(text, f);
    cr_assert_eq(fclose(f), 0, "cannot write %s", path);
}

/* Run the binary with args (NULL-terminated) and capture everything. */
static void cli_exec(const char *const *args, cli_run *r)
{
    char *argv[MAX_ARGS + 2];
    const char *bin = cli_bin();
    FILE *out, *err;
    size_t n = 0;
    pid_t pid;
    int st;

    cr_assert_eq(access(bin, X_OK), 0,
                 "%s not found: run make first (or set VRAMPLAN_BIN)", bin);
    argv[n++] = (char *)bin;
    while (args[n - 1] != NULL) {
        cr_assert_lt(n, MAX_ARGS + 1);
        argv[n] = (char *)args[n - 1];
        n++;
    }
    argv[n] = NULL;

    out = tmpfile();
    err = tmpfile();
    cr_assert(out != NULL && err != NULL);
    fflush(NULL);
    pid = fork();
    cr_assert_neq(pid, -1, "fork: %s", strerror(errno));
    if (pid == 0) {
        if (dup2(fileno(out), STDOUT_FILENO) < 0 ||
            dup2(fileno(err), STDERR_FILENO) < 0)
            _exit(126);
        execv(bin, argv);
        _exit(127);
    }
    while (waitpid(pid, &st, 0) < 0)
        cr_assert_eq(errno, EINTR, "waitpid: %s", strerror(errno));
    r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r->out = slurp(out);
    r->err = slurp(err);
    fclose(out);
    fclose(err);
}

static void cli_run_free(cli_run *r)
{
    free(r->out);
    free(r->err);
}

/* Fail at the first line where got differs from want. */
static void expect_same(const char *path, const char *want, const char *got)
{
    const char *w = want, *g = got, *wl = want, *gl = got;
    size_t line = 1;

    if (strcmp(want, got) == 0)
        return;
    while (*w != '\0' && *w == *g) {
        if (*w == '\n') {
            line++;
            wl = w + 1;
            gl = g + 1;
        }
        w++;
        g++;
    }
    cr_assert_fail("%s:%zu: output differs from the golden file\n"
                   "  expected: %.*s\n"
                   "  actual:   %.*s\n"
                   "(if the change is intended, rerun with "
                   "VRAMPLAN_UPDATE_GOLDEN=1 and review the diff)",
                   path, line, (int)strcspn(wl, "\n"), wl,
                   (int)strcspn(gl, "\n"), gl);
}

/* Run vramplan with args, compare stdout and stderr with the golden files
 * tests/golden/NAME.{out,err} (or rewrite them) and the exit status with
 * want_status. */
static void check_golden(const char *name, int want_status,
                         const char *const *args)
{
    char out_path[256], err_path[256];
    char *want_out, *want_err;
    cli_run r;

    snprintf(out_path, sizeof out_path, GOLDEN_DIR "%s.out", name);
    snprintf(err_path, sizeof err_path, GOLDEN_DIR "%s.err", name);
    cli_exec(args, &r);

    if (update_golden()) {
        write_file(out_path, r.out);
        write_file(err_path, r.err);
    } else {
        want_out = read_file(out_path);
        want_err = read_file(err_path);
        if (want_out == NULL || want_err == NULL)
            cr_assert_fail("golden file %s missing; run with "
                           "VRAMPLAN_UPDATE_GOLDEN=1",
                           want_out == NULL ? out_path : err_path);
        expect_same(out_path, want_out, r.out);
        expect_same(err_path, want_err, r.err);
        free(want_out);
        free(want_err);
    }
    cr_assert_eq(r.status, want_status,
                 "%s: exit status %d, expected %d; stderr:\n%s", name,
                 r.status, want_status, r.err);
    cli_run_free(&r);
}

#define GOLDEN(name, status, ...) \
    check_golden(name, status, (const char *const[]){__VA_ARGS__, NULL})

/* --- help and usage errors ----------------------------------------- */

Test(cli, help) { GOLDEN("help", 0, "--help"); }
Test(cli, help_short) { GOLDEN("help", 0, "-h"); }
Test(cli, estimate_help) { GOLDEN("estimate_help", 0, "estimate", "--help"); }

Test(cli, version)
{
    cli_run r;

    cli_exec((const char *const[]){"--version", NULL}, &r);
    cr_assert_str_eq(r.out, "vramplan " VRAMPLAN_VERSION "\n");
    cr_assert_str_eq(r.err, "");
    cr_assert_eq(r.status, 0);
    cli_run_free(&r);
}

Test(cli, no_command)
{
    check_golden("no_command", 2, (const char *const[]){NULL});
}
Test(cli, unknown_command) { GOLDEN("unknown_command", 2, "frobnicate"); }
Test(cli, unknown_option)
{
    GOLDEN("unknown_option", 2, "estimate", "models/mlp10.yaml",
           "--frobnicate");
}
Test(cli, missing_value)
{
    GOLDEN("missing_value", 2, "estimate", "models/mlp10.yaml", "--batch");
}
Test(cli, missing_model_argument) { GOLDEN("missing_model_argument", 2, "estimate"); }
Test(cli, batch_zero)
{
    GOLDEN("batch_zero", 2, "estimate", "models/mlp10.yaml", "--batch", "0");
}
Test(cli, batch_negative)
{
    GOLDEN("batch_negative", 2, "estimate", "models/mlp10.yaml", "--batch",
           "-1");
}
Test(cli, batch_not_a_number)
{
    GOLDEN("batch_not_a_number", 2, "estimate", "models/mlp10.yaml",
           "--batch", "abc");
}
Test(cli, batch_exponent)
{
    GOLDEN("batch_exponent", 2, "estimate", "models/mlp10.yaml", "--batch",
           "1e3");
}
Test(cli, budget_bad_unit)
{
    GOLDEN("budget_bad_unit", 2, "estimate", "models/mlp10.yaml", "--budget",
           "24XB");
}

/* --- model errors --------------------------------------------------- */

Test(cli, missing_model)
{
    GOLDEN("missing_model", 2, "estimate",
           "tests/data/bad/cli-does-not-exist.yaml");
}
Test(cli, bad_model_syntax)
{
    GOLDEN("bad_model_syntax", 3, "estimate",
           "tests/data/bad/cli-syntax.yaml");
}
Test(cli, bad_model_unknown_key)
{
    GOLDEN("bad_model_unknown_key", 3, "estimate",
           "tests/data/bad/cli-unknown-key.yaml");
}
Test(cli, bad_model_range)
{
    GOLDEN("bad_model_range", 3, "estimate", "tests/data/bad/cli-range.yaml");
}
Test(cli, checkpoint_no_match)
{
    GOLDEN("checkpoint_no_match", 2, "estimate", "models/mlp10.yaml",
           "--checkpoint", "nosuch.*");
}

/* --- estimates ------------------------------------------------------ */

Test(cli, estimate_gpt2_small_table)
{
    GOLDEN("estimate_gpt2_small_table", 0, "estimate",
           "models/gpt2-small.yaml", "--batch", "8", "--seq", "1024",
           "--precision", "amp-bf16");
}
Test(cli, estimate_gpt2_small_json)
{
    GOLDEN("estimate_gpt2_small_json", 0, "estimate",
           "models/gpt2-small.yaml", "--batch", "8", "--seq", "1024",
           "--precision", "amp-bf16", "--format", "json");
}
Test(cli, estimate_mlp10_csv)
{
    GOLDEN("estimate_mlp10_csv", 0, "estimate", "models/mlp10.yaml",
           "--format", "csv");
}
Test(cli, budget_does_not_fit)
{
    GOLDEN("budget_does_not_fit", 1, "estimate", "models/mlp10.yaml",
           "--budget", "1MiB");
}

/* The timeline has its header and one row per simulated event. */
Test(cli, timeline_has_one_row_per_event)
{
    static const char header[] =
        "seq,step,phase,op,category,action,bytes,allocated,reserved\n";
    char path[] = "/tmp/vramplan-timeline-XXXXXX";
    const char *events_key;
    unsigned long long events;
    size_t rows = 0;
    char *csv;
    cli_run r;
    int fd = mkstemp(path);

    cr_assert_neq(fd, -1, "mkstemp: %s", strerror(errno));
    close(fd);
    cli_exec((const char *const[]){"estimate", "models/mlp10.yaml",
                                   "--steps", "2", "--format", "json",
                                   "--timeline", path, NULL}, &r);
    csv = read_file(path);
    unlink(path);
    cr_assert_eq(r.status, 0, "stderr:\n%s", r.err);
    cr_assert_not_null(csv);

    events_key = strstr(r.out, "\"events\": ");
    cr_assert_not_null(events_key);
    events = strtoull(events_key + strlen("\"events\": "), NULL, 10);
    cr_assert_eq(strncmp(csv, header, strlen(header)), 0,
                 "timeline header: %.*s", (int)strcspn(csv, "\n"), csv);
    for (const char *p = csv; *p != '\0'; p++)
        rows += *p == '\n';
    cr_assert_eq(rows - 1, events, "%zu rows for %llu events", rows - 1,
                 events);
    free(csv);
    cli_run_free(&r);
}
