/* A program built against an installed vramplan with pkg-config (the
 * install test): find a shipped model by name through the search path,
 * simulate it, print the peak. */
#include <stdio.h>

#include <vramplan/vramplan.h>

int main(void)
{
    char path[4096];
    vp_error err;
    if (vp_resource_find(VP_RES_MODEL, "mlp10", NULL, path, sizeof path,
                         &err) != VP_OK) {
        fprintf(stderr, "example: %s\n", err.msg);
        return 1;
    }
    vp_model *m = vp_model_load(path, &err);
    vp_graph *g = m ? vp_graph_build(m, 2, 0, &err) : NULL;
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 2;
    vp_estimate e;
    if (!g || vp_simulate(g, &s, &e, NULL, NULL, &err) != VP_OK) {
        fprintf(stderr, "example: %s\n", err.msg);
        return 1;
    }
    printf("%s peak_alloc %llu\n", path, (unsigned long long)e.peak_alloc);
    vp_graph_free(g);
    vp_model_free(m);
    return 0;
}
