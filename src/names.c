/* vramplan: names of the enums in graph.h and sim.h, their parsers, and
 * the default training setup (vp_setup_init).
 *
 * Every table is generated from the header's X-macro map where one exists,
 * so a new precision or optimizer needs no change here. */
#include <string.h>

#include "util.h"
#include "vramplan/defaults.h"
#include "vramplan/graph.h"
#include "vramplan/sim.h"
#include "vramplan/units.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *const precision_names[] = {
    VP_PRECISION_MAP(VP__NAME_STR)};

static const char *const optimizer_names[] = {
    VP_OPTIMIZER_MAP(VP__NAME_STR)};

static const char *const cache_names[] = {
    VP_CACHE_MAP(VP__NAME_STR)};

static const char *const category_names[] = {
    VP_CATEGORY_MAP(VP__NAME_STR)};

static const char *const op_kind_names[] = {
    VP_OP_KIND_MAP(VP__NAME_STR)};

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

VP__ENUM_NAME_FN(vp_precision, vp_precision, precision_names)
VP__ENUM_NAME_FN(vp_optimizer, vp_optimizer, optimizer_names)
VP__ENUM_NAME_FN(vp_category, vp_category, category_names)
VP__ENUM_NAME_FN(vp_phase, vp_phase, phase_names)
VP__ENUM_NAME_FN(vp_op_kind, vp_op_kind, op_kind_names)
VP__ENUM_NAME_FN(vp_attn_impl, vp_attn_impl, attn_names)
VP__ENUM_NAME_FN(vp_cache_impl, vp_cache_impl, cache_names)

VP__ENUM_PARSE_FN(vp_precision, vp_precision, precision_names)
VP__ENUM_PARSE_FN(vp_optimizer, vp_optimizer, optimizer_names)
VP__ENUM_PARSE_FN(vp_attn_impl, vp_attn_impl, attn_names)
VP__ENUM_PARSE_FN(vp_cache_impl, vp_cache_impl, cache_names)

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
