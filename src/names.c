/* vramplan: names of the enums in graph.h and sim.h, their parsers, and
 * the default training setup (vp_setup_init).
 *
 * Every table is generated from the header's X-macro map where one exists,
 * so a new precision or optimizer needs no change here. */
#include <string.h>

#include "vramplan/defaults.h"
#include "vramplan/graph.h"
#include "vramplan/sim.h"
#include "vramplan/units.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *const precision_names[] = {
#define VP__NAME(name, str) [VP_PREC_##name] = str,
    VP_PRECISION_MAP(VP__NAME)
#undef VP__NAME
};

static const char *const optimizer_names[] = {
#define VP__NAME(name, str) [VP_OPT_##name] = str,
    VP_OPTIMIZER_MAP(VP__NAME)
#undef VP__NAME
};

static const char *const cache_names[] = {
#define VP__NAME(name, str) [VP_CACHE_##name] = str,
    VP_CACHE_MAP(VP__NAME)
#undef VP__NAME
};

static const char *const category_names[] = {
#define VP__NAME(name, str) [VP_CAT_##name] = str,
    VP_CATEGORY_MAP(VP__NAME)
#undef VP__NAME
};

static const char *const op_kind_names[] = {
#define VP__NAME(name, str) [VP_OP_##name] = str,
    VP_OP_KIND_MAP(VP__NAME)
#undef VP__NAME
};

/* vp_phase and vp_attn_impl have no map in their headers. */
static const char *const phase_names[] = {
    [VP_PHASE_SETUP] = "setup",
    [VP_PHASE_FORWARD] = "forward",
    [VP_PHASE_BACKWARD] = "backward",
    [VP_PHASE_OPTIMIZER] = "optimizer",
};

static const char *const attn_names[] = {
    [VP_ATTN_SDPA] = "sdpa",
    [VP_ATTN_FLASH] = "flash",
    [VP_ATTN_EFFICIENT] = "efficient",
    [VP_ATTN_EAGER] = "eager",
    [VP_ATTN_MATH] = "math",
};

_Static_assert(COUNT(precision_names) == VP_PREC__COUNT, "precision names");
_Static_assert(COUNT(optimizer_names) == VP_OPT__COUNT, "optimizer names");
_Static_assert(COUNT(category_names) == VP_CAT__COUNT, "category names");
_Static_assert(COUNT(cache_names) == VP_CACHE__COUNT, "cache names");
_Static_assert(COUNT(op_kind_names) == VP_OP__COUNT, "op kind names");
_Static_assert(COUNT(phase_names) == VP_PHASE__COUNT, "phase names");

/* names[v], or "unknown" for a value outside the table. */
static const char *name_of(const char *const *names, size_t n, int v)
{
    return v >= 0 && (size_t)v < n ? names[v] : "unknown";
}

/* The index of s in names, or -1. */
static int index_of(const char *const *names, size_t n, const char *s)
{
    if (s == NULL)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (strcmp(names[i], s) == 0)
            return (int)i;
    return -1;
}

const char *vp_precision_name(vp_precision p)
{
    return name_of(precision_names, COUNT(precision_names), (int)p);
}

const char *vp_optimizer_name(vp_optimizer o)
{
    return name_of(optimizer_names, COUNT(optimizer_names), (int)o);
}

const char *vp_category_name(vp_category c)
{
    return name_of(category_names, COUNT(category_names), (int)c);
}

const char *vp_phase_name(vp_phase p)
{
    return name_of(phase_names, COUNT(phase_names), (int)p);
}

const char *vp_op_kind_name(vp_op_kind k)
{
    return name_of(op_kind_names, COUNT(op_kind_names), (int)k);
}

const char *vp_attn_impl_name(vp_attn_impl a)
{
    return name_of(attn_names, COUNT(attn_names), (int)a);
}

const char *vp_cache_impl_name(vp_cache_impl c)
{
    return name_of(cache_names, COUNT(cache_names), (int)c);
}

vp_status vp_precision_parse(const char *s, vp_precision *out)
{
    int i = index_of(precision_names, COUNT(precision_names), s);

    if (i < 0)
        return VP_EARG;
    *out = (vp_precision)i;
    return VP_OK;
}

vp_status vp_optimizer_parse(const char *s, vp_optimizer *out)
{
    int i = index_of(optimizer_names, COUNT(optimizer_names), s);

    if (i < 0)
        return VP_EARG;
    *out = (vp_optimizer)i;
    return VP_OK;
}

vp_status vp_attn_impl_parse(const char *s, vp_attn_impl *out)
{
    int i = index_of(attn_names, COUNT(attn_names), s);

    if (i < 0)
        return VP_EARG;
    *out = (vp_attn_impl)i;
    return VP_OK;
}

vp_status vp_cache_impl_parse(const char *s, vp_cache_impl *out)
{
    int i = index_of(cache_names, COUNT(cache_names), s);

    if (i < 0)
        return VP_EARG;
    *out = (vp_cache_impl)i;
    return VP_OK;
}

void vp_setup_init(vp_setup *s)
{
    memset(s, 0, sizeof *s);
    s->batch = 1;
    s->seq = 0;
    s->precision = VP_PREC_FP32;
    s->optimizer = VP_OPT_ADAMW;
    s->attn = VP_ATTN_SDPA;
    s->attn_set = false;
    s->set_to_none = true;
    s->inference = false;
    s->accum = 1;
    s->steps = VP_DEFAULT_STEPS;
    s->fresh_process = true;
    s->checkpoint = NULL;
    s->n_checkpoint = 0;
    s->cublas_workspace = VP_CUBLAS_WORKSPACE_SM90;
    s->cublaslt_workspace = VP_CUBLASLT_WORKSPACE;
    s->context_bytes = VP_DEFAULT_CONTEXT_BYTES;
    s->sm_count = VP_DEFAULT_SM_COUNT;
    vp_allocator_config_init(&s->alloc);
    vp_finetune_init(&s->ft);
}
