/* The processes below a probe trial's keeper: found from /proc (each
 * process's parent, field 4 of /proc/PID/stat) and signalled. The keeper is
 * a child subreaper (PR_SET_CHILD_SUBREAPER, prctl(2)), so a descendant
 * whose parent ends, one that called setsid or was double-forked included,
 * becomes the keeper's child instead of init's: the tree below the keeper
 * holds every process the trial started and none other. */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "internal.h"
#include "probe_impl.h"

typedef struct proc_link {
    pid_t pid, ppid;
    bool below; /* a descendant of the root */
} proc_link;

static int by_pid(const void *a, const void *b)
{
    pid_t x = ((const proc_link *)a)->pid, y = ((const proc_link *)b)->pid;

    return (x > y) - (x < y);
}

/* The parent of pid from /proc/PID/stat ("PID (COMM) STATE PPID ...", COMM
 * may hold spaces and parentheses: the last ')' ends it); 0 if gone. */
static pid_t parent_of(const char *pid)
{
    char path[64], buf[512], *p;
    long ppid;
    size_t n;
    FILE *f;

    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    f = fopen(path, "re");
    if (f == NULL)
        return 0;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    p = strrchr(buf, ')');
    if (p == NULL || sscanf(p + 1, " %*c %ld", &ppid) != 1 || ppid <= 0)
        return 0;
    return (pid_t)ppid;
}

static bool is_pid(const char *s)
{
    if (*s == '\0')
        return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return false;
    return true;
}

/* Every process's (pid, parent) from /proc, sorted by pid. */
static proc_link *read_links(size_t *n_out)
{
    proc_link *v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *d;
    DIR *dir = opendir("/proc");

    *n_out = 0;
    if (dir == NULL)
        return NULL;
    while ((d = readdir(dir)) != NULL) {
        pid_t pp;

        if (!is_pid(d->d_name) || (pp = parent_of(d->d_name)) == 0)
            continue;
        if (!vp__grow((void **)&v, &cap, n + 1, sizeof *v))
            break;
        v[n].pid = (pid_t)strtol(d->d_name, NULL, 10);
        v[n].ppid = pp;
        v[n].below = false;
        n++;
    }
    closedir(dir);
    if (n > 1)
        qsort(v, n, sizeof *v, by_pid);
    *n_out = n;
    return v;
}

static bool below(const proc_link *v, size_t n, pid_t root, pid_t ppid)
{
    proc_link key = {ppid, 0, false};
    const proc_link *p;

    if (ppid == root)
        return true;
    p = bsearch(&key, v, n, sizeof *v, by_pid);
    return p != NULL && p->below;
}

size_t vp__proc_tree_signal(pid_t root, int sig)
{
    size_t n, hit = 0;
    proc_link *v = read_links(&n);
    bool grew = true;

    /* mark the descendants, one generation more per pass */
    while (grew) {
        grew = false;
        for (size_t i = 0; i < n; i++)
            if (!v[i].below && v[i].pid != root &&
                below(v, n, root, v[i].ppid)) {
                v[i].below = true;
                grew = true;
            }
    }
    for (size_t i = 0; i < n; i++)
        if (v[i].below && kill(v[i].pid, sig) == 0)
            hit++;
    free(v);
    return hit;
}
