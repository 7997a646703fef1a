/* Python pickles (pickle.c). Not installed.
 * A stream writer: begin, then values; a container is opened with dict or
 * list, each value of a list and each key-value pair of a dict is followed
 * by vp__pk_item, and close ends it. Errors are sticky; end reports them. */
#ifndef VRAMPLAN_PICKLE_H
#define VRAMPLAN_PICKLE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define VP_PK_MAX_DEPTH 16
#define VP_PK_NO_MEMO UINT32_MAX
typedef struct vp__pk {
    FILE *f;
    bool bad;
    uint32_t memo;                      /* next memo slot            */
    uint32_t depth;
    uint8_t batch_op[VP_PK_MAX_DEPTH];  /* SETITEMS or APPENDS       */
    uint32_t items[VP_PK_MAX_DEPTH];    /* items in the open batch   */
} vp__pk;
void vp__pk_begin(vp__pk *w, FILE *f);
bool vp__pk_end(vp__pk *w); /* false if a write failed */
void vp__pk_int(vp__pk *w, int64_t v);
void vp__pk_uint(vp__pk *w, uint64_t v);
void vp__pk_bool(vp__pk *w, bool v);
void vp__pk_none(vp__pk *w);
void vp__pk_float(vp__pk *w, double v);
void vp__pk_str(vp__pk *w, const char *s); /* invalid UTF-8 becomes '?' */
void vp__pk_key(vp__pk *w, const char *key);
/* A string written once and then referenced: *slot starts VP_PK_NO_MEMO. */
void vp__pk_str_memo(vp__pk *w, const char *s, uint32_t *slot);
void vp__pk_dict(vp__pk *w);
void vp__pk_list(vp__pk *w);
void vp__pk_item(vp__pk *w);
void vp__pk_close(vp__pk *w);
void vp__pk_tuple2(vp__pk *w); /* the two values on top become a tuple */
/* Memoize the value on top (returns its slot); push a memoized value. */
uint32_t vp__pk_memo_put(vp__pk *w);
void vp__pk_memo_get(vp__pk *w, uint32_t id);

#endif
