/* vramplan internal headers, by noun (not installed):
 *   util.h            invariants, arena, files, growth, suggestions, globs,
 *                     JSON syntax check
 *   yaml_doc.h        YAML documents with positions (loaders only)
 *   expr.h            the graph form's size expressions
 *   model_internal.h  model descriptions as plain values
 *   graph_internal.h  the layer graph's storage and builders
 *   sim_internal.h    the simulator's engine and op table
 *   hashmap.h         a map of 64-bit keys to 64-bit values
 *   pickle.h          a Python pickle stream writer
 * This umbrella gathers the ones every module may use (not yaml_doc.h,
 * sim_internal.h, hashmap.h or pickle.h); a module of one noun includes
 * that noun's header. */
#ifndef VRAMPLAN_INTERNAL_H
#define VRAMPLAN_INTERNAL_H

#include "expr.h"
#include "graph_internal.h"
#include "model_internal.h"
#include "util.h"
#include "vramplan/vramplan.h"

#endif
