/* libFuzzer harness: one ground-truth case line (vp_validate_line), and
 * the env line, with the models of models/ (run from the repository
 * root). Case lines of large models simulate them: each run is bounded
 * by the model's size, not by the line. */
#include <stddef.h>
#include <stdint.h>

#include "vramplan/vramplan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const dirs[] = {"fuzz/models"};
    vp_error err;
    vp_gt_env env;
    (void)vp_validate_env((const char *)data, size, "fuzz.jsonl", 1, &env,
                          &err);
    vp_validate_opts o = {0};
    o.path = "fuzz.jsonl";
    o.line = 2;
    o.dirs = dirs;
    o.n_dirs = 1;
    vp_case_result r;
    (void)vp_validate_line((const char *)data, size, &o, &r, &err);
    return 0;
}
