/* vramplan: one self-contained HTML page of a simulated run.
 *
 * The page (inline SVG and CSS, no script, nothing fetched) shows the
 * allocated bytes over the run stacked by category, the reserved bytes,
 * the phases of every step, the budget, the peak and what holds it (by
 * category and by layer), with the figures of the estimate.
 *
 *   vp_html *h = vp_html_new(&err);
 *   vp_simulate(g, &setup, &est, vp_html_event, h, &err);
 *   vp_html_info info = {.title = "gpt2-small", .est = &est};
 *   vp_html_write(h, &info, f, &err);
 *   vp_html_free(h); */
#ifndef VRAMPLAN_HTML_H
#define VRAMPLAN_HTML_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "vramplan/error.h"
#include "vramplan/sim.h"

typedef struct vp_html vp_html;

/* A recorder of a run's events. NULL with *err set (VP_ENOMEM). Release
 * with vp_html_free (NULL is a no-op). */
vp_html *vp_html_new(vp_error *err);
void vp_html_free(vp_html *h);

/* The vp_sim_event_fn to pass to vp_simulate, with the recorder as ud.
 * Running out of memory stops the recording; vp_html_write reports it. */
void vp_html_event(const vp_sim_event *ev, void *ud);

/* What the page says besides the recorded events. Strings are plain text
 * (the writer escapes them); NULL strings are left out. */
typedef struct vp_html_info {
    const char *title;       /* the model                                  */
    const char *setup;       /* one line: batch, precision, ...           */
    const vp_estimate *est;  /* the run's figures (required)               */
    uint64_t budget;         /* bytes the allocator may reserve; 0 = none  */
    const char *failure;     /* why the run stopped (out of memory), or
                                NULL when it completed                     */
} vp_html_info;

/* Write the page to f. Returns VP_OK; VP_EARG without events or estimate;
 * VP_ENOMEM (recording or drawing); VP_EIO when a write fails. */
vp_status vp_html_write(const vp_html *h, const vp_html_info *info, FILE *f,
                        vp_error *err);

#endif
