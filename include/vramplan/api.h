/* vramplan: one JSON-in, JSON-out entry point, for bindings (the Python
 * package in python/vramplan calls it through ctypes) so that they need
 * not mirror the C structures.
 *
 * A request is a JSON object with a "command" and the setup:
 *
 *   {"command": "estimate", "model": "gpt2-small", "batch": 8,
 *    "seq": 1024, "precision": "amp-bf16", "budget": "24GiB"}
 *
 * commands   estimate, maxbatch, plan (one GPU: needs "gpu")
 * model      a model name (models/NAME.yaml in the search path of
 *            resource.h) or a file (YAML or a Hugging Face config.json)
 * setup      batch, seq, precision, optimizer, checkpoint ("none", "all"
 *            or segment names and patterns), selective, accum, steps,
 *            attention, keep_grads, inference, expandable_segments,
 *            offload_optimizer, offload_activations, compress_activations
 *            (2, 4 or 8), int8_weights, context, cublas_workspace
 * budget     bytes (an integer), a size ("24GiB") or, with "gpu", a
 *            fraction of the GPU's memory (0.9)
 * gpu        a GPU profile name or file; gpu_dir is searched first
 * plan       global_batch (default 32)
 *
 * Sizes in the response are exact integers of bytes. An unknown key, a
 * value of the wrong type and an unknown name are errors that name them. */
#ifndef VRAMPLAN_API_H
#define VRAMPLAN_API_H

#include "vramplan/error.h"

/* The longest request: a request is a setup of a few hundred bytes (a
 * model is named or given as a file, never inline). */
#define VP_API_MAX_REQUEST (1u << 20)

/* Run the request (at most VP_API_MAX_REQUEST bytes: VP_ELIMIT past it,
 * before any parsing). On VP_OK, or VP_EOOM for an estimate that does not fit
 * in its budget (the response then says "fits": false with the figures up
 * to the failure), *response is a JSON object (NUL-terminated, release
 * with vp_api_free). On other errors *response is NULL and *err says why,
 * with the file, line and column for an error in a model or profile file
 * (VP_ESYNTAX for a request that is not JSON, VP_EARG for a bad field). */
vp_status vp_api_call(const char *request, char **response, vp_error *err);

/* Release a response of vp_api_call. NULL is a no-op. */
void vp_api_free(char *response);

#endif
