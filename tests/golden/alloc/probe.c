// alloc_probe: run ggml's own graph allocator (ggml_gallocr on the CPU buffer type) over a graph
// described on stdin, print the compute buffer size and every node's offset in it.
//
// Input (one record per line, tensors before their use):
//   T id type ne0 ne1 ne2 ne3 nb0 nb1 nb2 nb3 op external view_src view_offs flags nsrc src... name
//     op: ggml_op_name (MUL_MAT, UNARY, NONE, ...); external 1 = the tensor already has data
//     (a leaf); view_src/src: ids or -1; flags: GGML tensor flags (INPUT 1, OUTPUT 2, PARAM 4)
//   E id      ggml_build_forward_expand(gf, tensor id), in order
// Output: "size N" then "node i offset" (offset -1: not in the compute buffer), "n_nodes N".
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static enum ggml_op op_by_name(const char * name) {
    for (int i = 0; i < GGML_OP_COUNT; i++) {
        if (strcmp(ggml_op_name((enum ggml_op) i), name) == 0) {
            return (enum ggml_op) i;
        }
    }
    fprintf(stderr, "unknown op %s\n", name);
    exit(2);
}

#define MAXT 100000
static struct ggml_tensor * tensors[MAXT];
static char dummy[64] __attribute__((aligned(64)));

int main(void) {
    struct ggml_init_params params = { .mem_size = (size_t) 64 << 20, .mem_buffer = NULL, .no_alloc = true };
    struct ggml_context * ctx = ggml_init(params);
    struct ggml_cgraph * gf = ggml_new_graph_custom(ctx, 65536, false);
    char kind[8];
    while (scanf("%7s", kind) == 1) {
        if (kind[0] == 'T') {
            int id, type, external, view_src, flags, nsrc;
            long long ne[4], nb[4], view_offs;
            char op[64], name[256];
            if (scanf("%d %d %lld %lld %lld %lld %lld %lld %lld %lld %63s %d %d %lld %d %d", &id, &type, &ne[0], &ne[1],
                      &ne[2], &ne[3], &nb[0], &nb[1], &nb[2], &nb[3], op, &external, &view_src, &view_offs, &flags,
                      &nsrc) != 16) {
                fprintf(stderr, "bad T record\n");
                return 2;
            }
            int64_t ne64[4] = { ne[0], ne[1], ne[2], ne[3] };
            struct ggml_tensor * t = ggml_new_tensor(ctx, (enum ggml_type) type, 4, ne64);
            for (int i = 0; i < 4; i++) {
                t->nb[i] = (size_t) nb[i];
            }
            t->op = op_by_name(op);
            for (int j = 0; j < nsrc; j++) {
                int s;
                if (scanf("%d", &s) != 1) {
                    return 2;
                }
                t->src[j] = s < 0 ? NULL : tensors[s];
            }
            if (scanf(" %255[^\n]", name) == 1) {
                ggml_set_name(t, name);
            }
            if (view_src >= 0) {
                t->view_src = tensors[view_src];
                t->view_offs = (size_t) view_offs;
            }
            t->flags = flags;
            if (external && view_src < 0) {
                t->data = dummy; // data set elsewhere (a weight buffer, mmap): ggml_gallocr leaves it alone
            }
            tensors[id] = t;
        } else if (kind[0] == 'E') {
            int id;
            if (scanf("%d", &id) != 1) {
                return 2;
            }
            ggml_build_forward_expand(gf, tensors[id]);
        }
    }
    ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_cpu_buffer_type());
    if (!ggml_gallocr_reserve(galloc, gf)) {
        fprintf(stderr, "reserve failed\n");
        return 1;
    }
    printf("size %zu\n", ggml_gallocr_get_buffer_size(galloc, 0));
    if (!ggml_gallocr_alloc_graph(galloc, gf)) {
        fprintf(stderr, "alloc failed\n");
        return 1;
    }
    int n = ggml_graph_n_nodes(gf);
    printf("n_nodes %d\n", n);
    for (int i = 0; i < n; i++) {
        struct ggml_tensor * t = ggml_graph_node(gf, i);
        long long off = -1;
        if (t->buffer != NULL) {
            off = (long long) ((char *) t->data - (char *) ggml_backend_buffer_get_base(t->buffer));
        }
        printf("node %d %lld %s\n", i, off, t->name);
    }
    ggml_gallocr_free(galloc);
    ggml_free(ctx);
    return 0;
}
