/* libFuzzer harness: model -> graph -> one simulated step at small sizes.
 * The first two bytes choose the setup (precision, optimizer,
 * checkpointing, accumulation, inference, expandable segments); the rest
 * is a YAML model. Inputs whose graph is large are skipped, so that each
 * run stays short (the limits themselves are fuzz_model's). */
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "vramplan/vramplan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    uint8_t a = data[0], b = data[1];
    vp_error err;
    vp_model *m = vp_model_parse_buf((const char *)data + 2, size - 2,
                                     "fuzz.yaml", 0, &err);
    if (m == NULL)
        return 0;
    vp_graph *g = vp_graph_build(m, 1 + (a & 3), 4 + (b & 15), &err);
    bool ck[64] = {false};
    if (g != NULL && vp_graph_op_count(g) <= 2000 &&
        vp_graph_segment_count(g) <= 64) {
        vp_setup s;
        vp_setup_init(&s);
        s.steps = 1;
        s.precision = (vp_precision)((a >> 2) % VP_PREC__COUNT);
        s.optimizer = (vp_optimizer)((a >> 5) % VP_OPT__COUNT);
        s.accum = 1 + ((b >> 4) & 3) * 1000000u; /* the steady state */
        s.inference = (b >> 6) & 1;
        s.alloc.expandable_segments = (b >> 7) & 1;
        if ((b & 8) &&
            vp_graph_checkpoint_select(g, "all", ck, &err) == VP_OK)
            s.checkpoint = ck;
        vp_estimate e;
        (void)vp_simulate(g, &s, &e, NULL, NULL, &err);
    }
    vp_graph_free(g);
    vp_model_free(m);
    return 0;
}
