/* Module name -> linear layer, filled while a model loads (see nn/nn.h). */
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"

struct cdf_layer_index {
    int n, cap;
    char **names;
    cdf_linear_layer **layers;
    bool *sharded;
};

cdf_layer_index *cdf_layer_index_new(void) { return calloc(1, sizeof(cdf_layer_index)); }

void cdf_layer_index_clear(cdf_layer_index *ix) {
    if (!ix) return;
    for (int i = 0; i < ix->n; i++) free(ix->names[i]);
    ix->n = 0;
}

void cdf_layer_index_free(cdf_layer_index *ix) {
    if (!ix) return;
    cdf_layer_index_clear(ix);
    free(ix->names);
    free(ix->layers);
    free(ix->sharded);
    free(ix);
}

void cdf_layer_index_add(cdf_layer_index *ix, const char *name, cdf_linear_layer *l, bool sharded) {
    if (!ix) return;
    if (ix->n == ix->cap) {
        int cap = ix->cap ? ix->cap * 2 : 64;
        char **nn = realloc(ix->names, (size_t)cap * sizeof *nn);
        if (nn) ix->names = nn;
        cdf_linear_layer **nl = nn ? realloc(ix->layers, (size_t)cap * sizeof *nl) : NULL;
        if (nl) ix->layers = nl;
        bool *ns = nl ? realloc(ix->sharded, (size_t)cap * sizeof *ns) : NULL;
        if (!ns) return;
        ix->sharded = ns;
        ix->cap = cap;
    }
    char *d = strdup(name);
    if (!d) return;
    ix->names[ix->n] = d;
    ix->layers[ix->n] = l;
    ix->sharded[ix->n++] = sharded;
}

cdf_linear_layer *cdf_layer_index_find(const cdf_layer_index *ix, const char *name, bool *sharded) {
    for (int i = 0; ix && i < ix->n; i++)
        if (strcmp(ix->names[i], name) == 0) {
            if (sharded) *sharded = ix->sharded[i];
            return ix->layers[i];
        }
    return NULL;
}

int cdf_layer_index_count(const cdf_layer_index *ix) { return ix ? ix->n : 0; }

cdf_linear_layer *cdf_layer_index_at(const cdf_layer_index *ix, int i, const char **name) {
    if (!ix || i < 0 || i >= ix->n) return NULL;
    if (name) *name = ix->names[i];
    return ix->layers[i];
}

