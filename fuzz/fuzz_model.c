/* libFuzzer harness: the model loader, YAML (the graph and transformer
 * forms) and Hugging Face JSON (the first byte picks), then the graph at
 * a small batch and sequence. Built by `make fuzz` (clang). */
#include <stddef.h>
#include <stdint.h>

#include "vramplan/vramplan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int json = data[0] & 1;
    vp_error err;
    vp_model *m = vp_model_parse_buf((const char *)data + 1, size - 1,
                                     json ? "fuzz.json" : "fuzz.yaml", json,
                                     &err);
    if (m == NULL)
        return 0;
    vp_graph *g = vp_graph_build(m, 1, 8, &err);
    vp_graph_free(g);
    vp_model_free(m);
    return 0;
}
