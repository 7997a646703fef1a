/* estimate --snapshot FILE and --html FILE: recorders of the simulated
 * events (snapshot.h, html.h) chained in front of the --timeline writer,
 * and the files written once the run is over, also when it ran out of
 * memory (the picture then ends where the run stopped). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vramplan/html.h"
#include "vramplan/snapshot.h"

struct cli_pictures {
    vp_snapshot *snap;
    vp_html *html;
    const char *snap_path, *html_path;
    vp_sim_event_fn next; /* the --timeline writer, or NULL */
    void *next_ud;
};

/* An output file that cannot be recorded or written: CLI_USAGE. */
static int fail(const char *what, const char *path, const vp_error *err)
{
    return cli_fail("%s '%s': %s", what, path,
                    err->msg[0] ? err->msg : vp_strerror(err->code));
}

int cli_pictures_open(cli_pictures **out, const char *snapshot,
                      const char *html, const vp_setup *setup,
                      vp_sim_event_fn next, void *next_ud)
{
    vp_error err;
    cli_pictures *p = calloc(1, sizeof *p);

    *out = p;
    if (p == NULL)
        return cli_fail("out of memory");
    p->next = next;
    p->next_ud = next_ud;
    p->snap_path = snapshot;
    p->html_path = html;
    if (snapshot != NULL &&
        (p->snap = vp_snapshot_new(&setup->alloc, &err)) == NULL)
        return fail("cannot record the snapshot for", snapshot, &err);
    if (html != NULL && (p->html = vp_html_new(&err)) == NULL)
        return fail("cannot record the page for", html, &err);
    return -1;
}

void cli_pictures_event(const vp_sim_event *ev, void *ud)
{
    cli_pictures *p = ud;

    if (p->snap != NULL)
        vp_snapshot_event(ev, p->snap);
    if (p->html != NULL)
        vp_html_event(ev, p->html);
    if (p->next != NULL)
        p->next(ev, p->next_ud);
}

/* Open path for writing, write with fn, close; -1, or CLI_USAGE after
 * printing why. */
static int write_file(const char *path, const char *what,
                      vp_status (*fn)(const void *obj, const void *arg,
                                      FILE *f, vp_error *err),
                      const void *obj, const void *arg)
{
    vp_error err;
    FILE *f = fopen(path, "wb");

    if (f == NULL)
        return cli_fail("cannot open '%s' for writing: %s", path,
                        strerror(errno));
    vp_error_clear(&err);
    vp_status st = fn(obj, arg, f, &err);
    if (fclose(f) != 0 && st == VP_OK)
        st = vp_error_set(&err, VP_EIO, "%s", strerror(errno));
    if (st != VP_OK) {
        remove(path);
        return fail(what, path, &err);
    }
    return -1;
}

static vp_status snap_write(const void *obj, const void *arg, FILE *f,
                            vp_error *err)
{
    (void)arg;
    return vp_snapshot_write(obj, f, err);
}

static vp_status html_write(const void *obj, const void *arg, FILE *f,
                            vp_error *err)
{
    return vp_html_write(obj, arg, f, err);
}

int cli_pictures_write(const cli_pictures *p, const char *model,
                       const vp_setup *setup, const vp_estimate *est,
                       const char *failure)
{
    int rc;

    if (p->snap != NULL &&
        (rc = write_file(p->snap_path, "cannot write the snapshot",
                         snap_write, p->snap, NULL)) >= 0)
        return rc;
    if (p->html != NULL) {
        char line[256];
        snprintf(line, sizeof line,
                 "batch %" PRIu64 ", %s, %s, accum %" PRIu32 "%s, %" PRIu32
                 " steps simulated",
                 setup->batch, vp_precision_name(setup->precision),
                 vp_optimizer_name(setup->optimizer), setup->accum,
                 setup->inference ? ", inference" : "", setup->steps);
        vp_html_info info = {model, line, est, setup->alloc.limit, failure};
        if ((rc = write_file(p->html_path, "cannot write the page",
                             html_write, p->html, &info)) >= 0)
            return rc;
    }
    return -1;
}

void cli_pictures_close(cli_pictures *p)
{
    if (p == NULL)
        return;
    vp_snapshot_free(p->snap);
    vp_html_free(p->html);
    free(p);
}
