/* The probe's process tree (probe_tree.c), for the trial runner (probe.c). */
#ifndef VRAMPLAN_PROBE_IMPL_H
#define VRAMPLAN_PROBE_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* An out-of-memory detector fed a stream in pieces (vp_probe_oom_text on
 * each line; a line over 64 KiB in overlapping parts). */
typedef struct vp__oom_scan {
    char buf[2 * 65536];
    size_t len;
    bool found;
} vp__oom_scan;

void vp__oom_scan_init(vp__oom_scan *s);
void vp__oom_scan_feed(vp__oom_scan *s, const char *p, size_t n);
bool vp__oom_scan_end(vp__oom_scan *s); /* the last line; whether found */

/* Send sig to every process below root (root itself excluded), found
 * from /proc; the number signalled. */
size_t vp__proc_tree_signal(pid_t root, int sig);

#endif
