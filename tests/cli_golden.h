/* The golden-file harness of the CLI tests, shared by test_cli.c and
 * test_cli_search.c: run the binary (VRAMPLAN_BIN, default ./vramplan,
 * from the repository root), compare its stdout and stderr with
 * tests/golden/NAME.out and NAME.err and its exit status with the expected
 * one; VRAMPLAN_UPDATE_GOLDEN=1 rewrites the golden files. Include it once
 * per test program, after criterion.h. */
#ifndef VRAMPLAN_TESTS_CLI_GOLDEN_H
#define VRAMPLAN_TESTS_CLI_GOLDEN_H

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

#endif
