/* DeepSpeed's knobs from a JSON object (the API's and validate's
 * `ds_config`), dist_deepspeed.c. Not installed. */
#ifndef VRAMPLAN_DIST_DS_H
#define VRAMPLAN_DIST_DS_H

#include <jansson.h>

#include "vramplan/dist.h"

/* Each member through vp_ds_config_set (a number, a boolean or a
 * string); VP_EARG naming an unknown knob or a bad value. */
vp_status vp_ds_config_json(vp_ds_config *c, const json_t *obj,
                            vp_error *err);

#endif
