/* Plans for clusters: names of the enumerations and the published closed
 * forms (ZeRO model states, Korthikanti et al.'s activations). */
#include <string.h>

#include "cluster_impl.h"

#define NAME_FN(fn, type, map, prefix, count)                              \
    static const char *const fn##_names[] = {map(prefix)};                 \
    const char *fn(type v)                                                 \
    {                                                                      \
        return (unsigned)v < (count) ? fn##_names[v] : "?";                \
    }

#define STR_OF(name, str) str,

NAME_FN(vp_dtype_name, vp_dtype, VP_DTYPE_MAP, STR_OF, VP_DT__COUNT)
NAME_FN(vp_recompute_name, vp_recompute, VP_RECOMPUTE_MAP, STR_OF,
        VP_RC__COUNT)
NAME_FN(vp_schedule_name, vp_schedule, VP_SCHEDULE_MAP, STR_OF,
        VP_SCHED__COUNT)
NAME_FN(vp_sharding_name, vp_sharding, VP_SHARDING_MAP, STR_OF,
        VP_SHARD__COUNT)
NAME_FN(vp_engine_name, vp_engine, VP_ENGINE_MAP, STR_OF, VP_ENGINE__COUNT)
NAME_FN(vp_offload_name, vp_offload, VP_OFFLOAD_MAP, STR_OF,
        VP_OFFLOAD__COUNT)
NAME_FN(vp_export_format_name, vp_export_format, VP_EXPORT_MAP, STR_OF,
        VP_EXPORT__COUNT)

static vp_status parse_in(const char *s, const char *const *names, int n,
                          int *out)
{
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return VP_OK;
        }
    return VP_EARG;
}

#define PARSE_FN(fn, type, names, count)                                   \
    vp_status fn(const char *s, type *out)                                 \
    {                                                                      \
        int i;                                                             \
        if (parse_in(s, names, (count), &i) != VP_OK)                      \
            return VP_EARG;                                                \
        *out = (type)i;                                                    \
        return VP_OK;                                                      \
    }

PARSE_FN(vp_dtype_parse, vp_dtype, vp_dtype_name_names, VP_DT__COUNT)
PARSE_FN(vp_recompute_parse, vp_recompute, vp_recompute_name_names,
         VP_RC__COUNT)
PARSE_FN(vp_schedule_parse, vp_schedule, vp_schedule_name_names,
         VP_SCHED__COUNT)
PARSE_FN(vp_sharding_parse, vp_sharding, vp_sharding_name_names,
         VP_SHARD__COUNT)
PARSE_FN(vp_engine_parse, vp_engine, vp_engine_name_names, VP_ENGINE__COUNT)
PARSE_FN(vp_export_format_parse, vp_export_format,
         vp_export_format_name_names, VP_EXPORT__COUNT)

vp_engine vp_export_engine(vp_export_format f)
{
    switch (f) {
    case VP_EXPORT_DEEPSPEED:
        return VP_ENGINE_DEEPSPEED;
    case VP_EXPORT_TORCHRUN:
        return VP_ENGINE_TORCH;
    default:
        return VP_ENGINE_MEGATRON;
    }
}

double vp_zero_state_bytes(double psi, double k, double nd, int stage)
{
    switch (stage) {
    case 1:
        return 4 * psi + k * psi / nd;
    case 2:
        return 2 * psi + (2 + k) * psi / nd;
    case 3:
        return (2 + 2 + k) * psi / nd;
    default:
        return (2 + 2 + k) * psi;
    }
}

double vp_korthikanti_layer_bytes(double s, double b, double h, double a,
                                  double t, bool sp, vp_recompute rc)
{
    double sbh = s * b * h;
    if (t < 1)
        t = 1;
    if (rc == VP_RC_FULL)
        return 2 * sbh / (sp ? t : 1);
    double attn = 5 * a * s / h; /* the s x s terms, per sbh */
    if (rc == VP_RC_SELECTIVE)
        attn = 0;
    if (sp)
        return sbh / t * (34 + attn);
    return sbh * (10 + 24 / t + attn / t);
}
