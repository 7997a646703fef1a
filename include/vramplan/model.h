/* vramplan: model descriptions.
 *
 * A model description is read from a vramplan YAML file (the architecture
 * form for transformers, or the explicit graph form; see docs/MODEL_FORMAT.md)
 * or from a Hugging Face config.json. Loading checks the schema and keeps
 * every node's position, so that errors found later (when the description is
 * instantiated for a batch and sequence length) still point into the file. */
#ifndef VRAMPLAN_MODEL_H
#define VRAMPLAN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"

typedef struct vp_model vp_model;

/* Limits that bound the work any input can cause. */
#define VP_MAX_INPUT_BYTES (4u << 20)   /* model file size                  */
#define VP_MAX_NEST 64                  /* YAML nesting depth               */
#define VP_MAX_OPS 100000u              /* ops and block instances of a graph */
#define VP_MAX_LAYERS 1024u             /* a transformer's layers           */
#define VP_MAX_SEARCH_OPS 4096u         /* ops of a graph a search simulates
                                           many times (maxbatch, plan,
                                           techniques, batching)           */
#define VP_MAX_REPEAT 100000u           /* a single `repeat` count          */
#define VP_MAX_YAML_NODES 200000u       /* nodes in one document            */
#define VP_MAX_DIM ((uint64_t)1 << 40)  /* a size above is refused as absurd */

/* The sequence length of a transformer whose description gives none
 * (capped by its learned positions). */
#define VP_DEFAULT_SEQ 2048u

/* Load a model description from a file. ".json" files are read as Hugging
 * Face config.json; anything else as vramplan YAML. Returns a model owned
 * by the caller (vp_model_free), or NULL with *err set: VP_EIO, VP_ESYNTAX
 * (malformed YAML/JSON), VP_ESCHEMA (unknown key, missing or mistyped
 * field), VP_ERANGE (zero, negative or absurd size), VP_EUNSUPPORTED (an
 * HF model_type vramplan does not know), VP_ELIMIT, VP_EOVERFLOW. */
vp_model *vp_model_load(const char *path, vp_error *err);

/* Same, from a buffer; `name` is used as the path in error messages and
 * `is_json` selects the Hugging Face reader. */
vp_model *vp_model_parse_buf(const char *buf, size_t len, const char *name,
                             int is_json, vp_error *err);

/* Release a model. NULL is a no-op. */
void vp_model_free(vp_model *m);

/* The model's name (from `name:`, or the file's base name). Valid until
 * vp_model_free. */
const char *vp_model_name(const vp_model *m);

/* The model's default sequence length (transformers) or image side
 * (vision graphs), used when the setup gives none; 0 when the model has no
 * such dimension. */
uint64_t vp_model_default_seq(const vp_model *m);

/* "transformer" or "graph". */
const char *vp_model_form(const vp_model *m);

#endif
