/* libFuzzer harness: a Hugging Face config.json read for its KV cache
 * layout (serve, batching). */
#include <stddef.h>
#include <stdint.h>

#include "vramplan/kvcache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    vp_error err;
    vp_kv_layout kv;

    if (vp_kv_layout_from_hf_buf((const char *)data, size, "config.json",
                                  &kv, &err) == VP_OK)
        vp_kv_layout_destroy(&kv);
    return 0;
}
