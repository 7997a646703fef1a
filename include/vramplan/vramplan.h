/* vramplan: GPU memory-budget planner and simulator for deep-learning
 * training. Umbrella header.
 *
 *   vp_error err;
 *   vp_model *m = vp_model_load("models/gpt2-small.yaml", &err);
 *   vp_graph *g = vp_graph_build(m, 8, 1024, &err);
 *   vp_setup s; vp_setup_init(&s); s.batch = 8; s.precision = VP_PREC_AMP_BF16;
 *   vp_estimate e; vp_simulate(g, &s, &e, NULL, NULL, &err);
 *   // e.peak_alloc, e.peak_reserved, e.device_used, e.by_category[...]
 *   vp_graph_free(g); vp_model_free(m);
 */
#ifndef VRAMPLAN_H
#define VRAMPLAN_H

#include "vramplan/allocator.h"
#include "vramplan/cluster.h"
#include "vramplan/defaults.h"
#include "vramplan/dist.h"
#include "vramplan/error.h"
#include "vramplan/finetune.h"
#include "vramplan/gpu.h"
#include "vramplan/graph.h"
#include "vramplan/kvcache.h"
#include "vramplan/mig.h"
#include "vramplan/model.h"
#include "vramplan/sim.h"
#include "vramplan/units.h"
#include "vramplan/plan.h"
#include "vramplan/probe.h"
#include "vramplan/resource.h"
#include "vramplan/snapshot.h"
#include "vramplan/html.h"
#include "vramplan/api.h"
#include "vramplan/search.h"
#include "vramplan/serve.h"
#include "vramplan/techniques.h"
#include "vramplan/timing.h"
#include "vramplan/tp.h"
#include "vramplan/validate.h"

#define VRAMPLAN_VERSION "0.1.0"

#endif
