/* The search path of named GPU profiles and models (resource.h).
 *
 * VP_DATADIR and VP_SRCDIR come from the build (paths.h, written by the
 * Makefile): the data directory of the PREFIX the library was built for,
 * and the source tree. The directory of the running library or program is
 * found with dladdr (a shared library: its own file) and /proc/self/exe
 * (a program linked with the static library). */
#define _GNU_SOURCE /* dladdr, realpath */
#include "vramplan/resource.h"

#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"
#include "paths.h"

#define MAX_DIRS 24        /* directories searched at most          */
#define MAX_ENV_DIRS 16    /* of them from the environment variable */
#define MAX_NAMES 512      /* file names read for a suggestion      */
#define MAX_NAME 64

typedef struct kind_info {
    const char *sub;   /* folder under share/vramplan and the tree */
    const char *env;   /* environment variable                     */
    const char *what;  /* for messages                             */
    const char *exts[3];
} kind_info;

static const kind_info KINDS[VP_RES__COUNT] = {
    [VP_RES_GPU] = {"gpus", "VRAMPLAN_GPU_DIR", "GPU", {".yaml", NULL}},
    [VP_RES_MODEL] = {"models", "VRAMPLAN_MODEL_DIR", "model",
                      {".yaml", ".json", NULL}},
};

/* An object of this module: dladdr finds the file that holds it. */
static const char ANCHOR = 0;

typedef struct dir_list {
    size_t n;
    char dir[MAX_DIRS][PATH_MAX];
} dir_list;

static bool valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > MAX_NAME || s[0] == '.')
        return false;
    for (const char *c = s; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '-' && *c != '_' &&
            *c != '.')
            return false;
    return true;
}

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    return n >= t && strcmp(s + n - t, tail) == 0;
}

bool vp_resource_is_name(const char *text)
{
    return text && valid_name(text) && !ends_with(text, ".yaml") &&
           !ends_with(text, ".yml") && !ends_with(text, ".json");
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Add a directory if it exists and is not in the list yet (compared by
 * its canonical path). */
static void add_dir(dir_list *l, const char *path)
{
    char real[PATH_MAX];
    if (l->n == MAX_DIRS || !path || !*path || !is_dir(path) ||
        !realpath(path, real))
        return;
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->dir[i], real) == 0)
            return;
    memcpy(l->dir[l->n++], real, strlen(real) + 1);
}

/* dir/<rel> */
static void add_joined(dir_list *l, const char *dir, const char *rel)
{
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/%s", dir, rel);
    if (n > 0 && (size_t)n < sizeof path)
        add_dir(l, path);
}

/* PREFIX/share/vramplan/<sub> for the file `self` in PREFIX/<bin|lib>. */
static void add_beside(dir_list *l, const char *self, const char *sub)
{
    char real[PATH_MAX], rel[64];
    if (!self || !*self || !realpath(self, real))
        return;
    char *slash = strrchr(real, '/');
    if (!slash)
        return;
    *slash = '\0';
    snprintf(rel, sizeof rel, "../share/vramplan/%s", sub);
    add_joined(l, real, rel);
}

static void search_path(vp_resource_kind kind, const char *dir, dir_list *l)
{
    const kind_info *k = &KINDS[kind];
    l->n = 0;
    if (dir)
        add_dir(l, dir);
    const char *env = getenv(k->env);
    if (env) {
        size_t taken = 0;
        for (const char *p = env; *p && taken < MAX_ENV_DIRS;) {
            size_t len = strcspn(p, ":");
            char one[PATH_MAX];
            if (len > 0 && len < sizeof one) {
                memcpy(one, p, len);
                one[len] = '\0';
                add_dir(l, one);
                taken++;
            }
            p += len;
            if (*p == ':')
                p++;
        }
    }
    Dl_info info;
    if (dladdr(&ANCHOR, &info) && info.dli_fname)
        add_beside(l, info.dli_fname, k->sub);
    add_beside(l, "/proc/self/exe", k->sub);
    add_joined(l, VP_DATADIR, k->sub);
    add_joined(l, VP_SRCDIR, k->sub);
}

size_t vp_resource_dirs(vp_resource_kind kind, const char *dir,
                        void (*fn)(const char *dir, void *ud), void *ud)
{
    if ((unsigned)kind >= VP_RES__COUNT)
        return 0;
    dir_list *l = malloc(sizeof *l);
    if (!l)
        return 0;
    search_path(kind, dir, l);
    size_t n = l->n;
    for (size_t i = 0; fn && i < n; i++)
        fn(l->dir[i], ud);
    free(l);
    return n;
}

/* The names of the files of `kind` in the directories (for a suggestion);
 * names point into store. Returns the count. */
static size_t list_names(const kind_info *k, const dir_list *l,
                         char (*store)[MAX_NAME + 1], const char **names)
{
    size_t n = 0;
    for (size_t i = 0; i < l->n && n < MAX_NAMES; i++) {
        DIR *d = opendir(l->dir[i]);
        if (!d)
            continue;
        struct dirent *e;
        while (n < MAX_NAMES && (e = readdir(d)) != NULL) {
            for (size_t x = 0; k->exts[x]; x++) {
                size_t len = strlen(e->d_name), el = strlen(k->exts[x]);
                if (len <= el || len - el > MAX_NAME ||
                    !ends_with(e->d_name, k->exts[x]))
                    continue;
                memcpy(store[n], e->d_name, len - el);
                store[n][len - el] = '\0';
                names[n] = store[n];
                n++;
                break;
            }
        }
        closedir(d);
    }
    names[n] = NULL;
    return n;
}

static vp_status not_found(const kind_info *k, const char *name,
                           const dir_list *l, vp_error *err)
{
    if (l->n == 0)
        return vp_error_set(err, VP_EIO,
                            "unknown %s '%s': no %s directory found (set %s "
                            "or install vramplan)",
                            k->what, name, k->sub, k->env);
    char (*store)[MAX_NAME + 1] = malloc(MAX_NAMES * sizeof *store);
    const char **names = malloc((MAX_NAMES + 1) * sizeof *names);
    const char *hint = NULL;
    if (store && names) {
        list_names(k, l, store, names);
        hint = vp__suggest(name, names);
    }
    char dirs[1024];
    size_t used = 0;
    dirs[0] = '\0';
    for (size_t i = 0; i < l->n && used < sizeof dirs; i++) {
        int w = snprintf(dirs + used, sizeof dirs - used, "%s%s",
                         i ? ", " : "", l->dir[i]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    vp_status st;
    if (hint)
        st = vp_error_set(err, VP_EIO,
                          "unknown %s '%s' (did you mean '%s'?): no %s.yaml "
                          "in %s",
                          k->what, name, hint, name, dirs);
    else
        st = vp_error_set(err, VP_EIO, "unknown %s '%s': no %s.yaml in %s",
                          k->what, name, name, dirs);
    free(store);
    free(names);
    return st;
}

vp_status vp_resource_find(vp_resource_kind kind, const char *name,
                           const char *dir, char *path, size_t size,
                           vp_error *err)
{
    if ((unsigned)kind >= VP_RES__COUNT || !name || !path || size == 0)
        return vp_error_set(err, VP_EARG, "invalid resource lookup");
    const kind_info *k = &KINDS[kind];
    if (!valid_name(name))
        return vp_error_set(err, VP_EARG,
                            "invalid %s name '%.64s' (letters, digits, "
                            "'-', '_' and '.')",
                            k->what, name);
    dir_list *l = malloc(sizeof *l);
    if (!l)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    search_path(kind, dir, l);
    vp_status st = VP_EIO;
    for (size_t i = 0; i < l->n && st == VP_EIO; i++)
        for (size_t x = 0; k->exts[x] && st == VP_EIO; x++) {
            char p[PATH_MAX];
            struct stat sb;
            int w = snprintf(p, sizeof p, "%s/%s%s", l->dir[i], name,
                             k->exts[x]);
            if (w < 0 || (size_t)w >= sizeof p || stat(p, &sb) != 0 ||
                !S_ISREG(sb.st_mode))
                continue;
            if ((size_t)w >= size)
                st = vp_error_set(err, VP_ERANGE, "path too long: %s", p);
            else {
                memcpy(path, p, (size_t)w + 1);
                st = VP_OK;
            }
        }
    if (st == VP_EIO)
        st = not_found(k, name, l, err);
    free(l);
    return st;
}
