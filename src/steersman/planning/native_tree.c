/* The per-tree loops of steersman's batched tree search, in plain C (built and loaded by
 * native.py): the descent with Gumbel MuZero's selections (Sequential Halving at the root,
 * the deterministic interior selection, both with the completed-by-mix-value Q transform)
 * or MuZero's PUCT (parent-and-siblings transform), the expansion's writes and the backup.
 *
 * The arrays are the Tree's own (contiguous; float32 values, int64 indices, int32
 * visits). Every float is computed with the float32 operations of the compiled path's
 * column formulas (action_selection._completed_columns and friends), in the same order:
 * chains left to right, ties to the first index. Build without -ffast-math and with
 * -ffp-contract=off (no fused multiply-adds), at -O2 (gcc 12 at -O3 with AVX2 changed one
 * root selection in a test, cause not found).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
typedef __m256 (*Exp8)(__m256);
#endif

#define MAX_ACTIONS 64

enum { SELECT_GUMBEL = 0, SELECT_PUCT = 1 };

typedef struct {
    float value_scale, maxvisit_init, epsilon;
    int32_t rescale_values, use_mixed_value;
} QParams;

typedef struct {
    int64_t batch, nodes, actions, max_depth, kind;
    int32_t *node_visits;
    float *raw_values, *node_values;
    int64_t *parents, *action_from_parent, *depth;
    int64_t *children_index;
    float *children_prior_logits;
    int32_t *children_visits;
    float *children_rewards, *children_discounts, *children_values;
    uint8_t *root_invalid;         /* [B, A], 1: invalid */
    float *root_gumbel;            /* [B, A] (Gumbel) */
    int64_t *table;                /* [max_considered + 1, table_cols] (Gumbel) */
    int64_t table_cols, max_considered;
    QParams root_q, interior_q;    /* Gumbel: the transforms' keywords */
    float pb_c_init, pb_c_base, puct_epsilon;  /* PUCT */
    float *uniforms;               /* [S, B, A] (PUCT's tie-breaking noise) */
    float *prior_probs;            /* [B, N, A]: softmax(prior logits) of expanded nodes (Gumbel: clamped to tiny) */
    int64_t *out;                  /* [3, B]: parent, action, depth of each descent */
    int64_t *work;                 /* [2, B] scratch: the (tree, node) pairs still descending */
    float *qvalues;                /* [B, N, A] zeros, then r + discount * value of each child written (backup) */
    const float *step[4];          /* the model's reward, discount, prior logits, value of this simulation */
    int64_t step_stride[4];        /* their strides (elements) along the batch; logits' rows are contiguous */
    char **next;                   /* per leaf: [B, row], the next embeddings (contiguous) */
    int64_t *expanded;             /* [S, B]: each simulation's expanded actions (a copy of out[1]) */
    void *exp8;                    /* torch's Sleef_expf8_u10 (the exp of its vectorized kernels), or 0: expf */
    int64_t num_leaves;
    char **emb_store;              /* per leaf: [B, N, row] */
    char **emb_buf;                /* per leaf: [B, row], the parents' rows */
    int64_t *emb_row_bytes;
} Search;

static inline float fmax_chain(float a, float b) { return b > a ? b : a; }
static inline float fmin_chain(float a, float b) { return b < a ? b : a; }

/* x[i] = exp(x[i]) for i < n: torch's vectorized exp (Sleef, 8 at a time) where it was
 * found and the build has AVX2, else expf */
static void exp_row(const void *exp8, float *x, int64_t n) {
#if defined(__AVX2__)
    if (exp8) {
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, ((Exp8)exp8)(_mm256_loadu_ps(x + i)));
        if (i < n) {
            float tail[8] = {0};
            memcpy(tail, x + i, (size_t)(n - i) * sizeof(float));
            _mm256_storeu_ps(tail, ((Exp8)exp8)(_mm256_loadu_ps(tail)));
            memcpy(x + i, tail, (size_t)(n - i) * sizeof(float));
        }
        return;
    }
#else
    (void)exp8;
#endif
    for (int64_t i = 0; i < n; i++) x[i] = expf(x[i]);
}

/* softmax over n columns: max chain, exp(x - max), sum chain, division */
static void softmax_columns(const void *exp8, const float *x, int64_t n, float *out) {
    float top = x[0], norm;
    for (int64_t a = 1; a < n; a++) top = fmax_chain(top, x[a]);
    for (int64_t a = 0; a < n; a++) out[a] = x[a] - top;
    exp_row(exp8, out, n);
    norm = out[0];
    for (int64_t a = 1; a < n; a++) norm = norm + out[a];
    for (int64_t a = 0; a < n; a++) out[a] = out[a] / norm;
}

static int64_t argmax_columns(const float *x, int64_t n) {
    float best = x[0];
    int64_t index = 0;
    for (int64_t a = 1; a < n; a++)
        if (x[a] > best) { best = x[a]; index = a; }
    return index;
}

/* the cached prior probabilities of node n of tree b (at its expansion) */
static void cache_prior_probs(const Search *s, int64_t b, int64_t n) {
    const int64_t A = s->actions, base = (b * s->nodes + n) * A;
    float *probs = s->prior_probs + base;
    softmax_columns(s->exp8, s->children_prior_logits + base, A, probs);
    if (s->kind == SELECT_GUMBEL)
        for (int64_t a = 0; a < A; a++) probs[a] = probs[a] < 1.17549435e-38f ? 1.17549435e-38f : probs[a];
}


/* muzero_action_selection with qtransform_by_parent_and_siblings (action_selection._muzero_columns) */
static int64_t puct(const Search *s, int64_t b, int64_t n, int64_t d, const float *uniform) {
    const int64_t A = s->actions, base = (b * s->nodes + n) * A;
    const int32_t *vis = s->children_visits + base;
    const float *probs = s->prior_probs + base, *q = s->qvalues + base;
    float score[MAX_ACTIONS];
    const float node_value = s->node_values[b * s->nodes + n];
    const int32_t node_visit = s->node_visits[b * s->nodes + n];
    float lo, hi, span, pb_c, scale;
    lo = vis[0] > 0 ? q[0] : node_value;
    hi = lo;
    for (int64_t a = 1; a < A; a++) {
        const float x = vis[a] > 0 ? q[a] : node_value;
        lo = fmin_chain(lo, x);
        hi = fmax_chain(hi, x);
    }
    lo = fmin_chain(node_value, lo);
    hi = fmax_chain(node_value, hi);
    span = hi - lo;
    span = span < s->puct_epsilon ? s->puct_epsilon : span;
    pb_c = s->pb_c_init + logf(((float)node_visit + s->pb_c_base + 1.0f) / s->pb_c_base);
    scale = sqrtf((float)node_visit) * pb_c;
    for (int64_t a = 0; a < A; a++) {
        float x = ((vis[a] > 0 ? q[a] : lo) - lo) / span + scale * probs[a] / (float)(vis[a] + 1);
        x = x + 1e-7f * uniform[a];
        score[a] = (d == 0 && s->root_invalid[b * A + a]) ? -INFINITY : x;
    }
    return argmax_columns(score, A);
}

/* Gumbel MuZero's selections for G (tree, node) lanes at once, the lane loop innermost:
 * the per-action chains of one lane are sequential (latency-bound), G lanes overlap.
 * Each lane computes exactly what the single-node functions above compute. */
#define G 16

/* completed Q of the lanes (base[l] = (b * N + n) * A, raw[l] the node's raw value) */
/* the lanes' rows of the Q-values, visits and prior probabilities, lane-major */
static inline void gather_group(int64_t A, const int64_t *base, const float *qvalues, const int32_t *visits,
                         const float *prior_probs, float (*c)[G], int32_t (*vis)[G], float (*probs)[G]) {
    for (int l = 0; l < G; l++)
        for (int64_t a = 0; a < A; a++) {
            const int64_t e = base[l] + a;
            c[a][l] = qvalues[e];
            vis[a][l] = visits[e];
            probs[a][l] = prior_probs[e];
        }
}

static inline void completed_group(const Search *s, const int64_t *base, const float *raw, const QParams *p,
                                   float (*c)[G], int32_t (*vis)[G], int32_t *total) {
    const int64_t A = s->actions;
    const float epsilon = p->epsilon, maxvisit_init = p->maxvisit_init, value_scale = p->value_scale;
    float value[G], lo[G], hi[G], span[G], scale[G], probs[MAX_ACTIONS][G];
    int32_t maxv[G];
    gather_group(A, base, s->qvalues, s->children_visits, s->prior_probs, c, vis, probs);
    for (int l = 0; l < G; l++) { total[l] = vis[0][l]; maxv[l] = vis[0][l]; value[l] = raw[l]; }
    for (int64_t a = 1; a < A; a++)
        for (int l = 0; l < G; l++) {
            total[l] = total[l] + vis[a][l];
            maxv[l] = vis[a][l] > maxv[l] ? vis[a][l] : maxv[l];
        }
    if (p->use_mixed_value) {
        float sum_probs[G], weighted[G];
        for (int l = 0; l < G; l++) sum_probs[l] = vis[0][l] > 0 ? probs[0][l] : 0.0f;
        for (int64_t a = 1; a < A; a++)
            for (int l = 0; l < G; l++) sum_probs[l] = sum_probs[l] + (vis[a][l] > 0 ? probs[a][l] : 0.0f);
        for (int l = 0; l < G; l++) weighted[l] = vis[0][l] > 0 ? probs[0][l] * c[0][l] / sum_probs[l] : 0.0f;
        for (int64_t a = 1; a < A; a++)
            for (int l = 0; l < G; l++)
                weighted[l] = weighted[l] + (vis[a][l] > 0 ? probs[a][l] * c[a][l] / sum_probs[l] : 0.0f);
        for (int l = 0; l < G; l++) {
            const float tot = (float)total[l];
            value[l] = (value[l] + tot * weighted[l]) / (tot + 1.0f);
        }
    }
    for (int64_t a = 0; a < A; a++)
        for (int l = 0; l < G; l++) c[a][l] = vis[a][l] > 0 ? c[a][l] : value[l];
    if (p->rescale_values) {
        for (int l = 0; l < G; l++) { lo[l] = c[0][l]; hi[l] = c[0][l]; }
        for (int64_t a = 1; a < A; a++)
            for (int l = 0; l < G; l++) { lo[l] = fmin_chain(lo[l], c[a][l]); hi[l] = fmax_chain(hi[l], c[a][l]); }
        for (int l = 0; l < G; l++) { span[l] = hi[l] - lo[l]; span[l] = span[l] < epsilon ? epsilon : span[l]; }
        for (int64_t a = 0; a < A; a++)
            for (int l = 0; l < G; l++) c[a][l] = (c[a][l] - lo[l]) / span[l];
    }
    for (int l = 0; l < G; l++) scale[l] = (maxvisit_init + (float)maxv[l]) * value_scale;
    for (int64_t a = 0; a < A; a++)
        for (int l = 0; l < G; l++) c[a][l] = scale[l] * c[a][l];
}

static inline void argmax_group(const Search *s, float (*restrict x)[G], int64_t *restrict action) {
    float best[G];
    for (int l = 0; l < G; l++) { best[l] = x[0][l]; action[l] = 0; }
    for (int64_t a = 1; a < s->actions; a++)
        for (int l = 0; l < G; l++) {
            const int better = x[a][l] > best[l];
            best[l] = better ? x[a][l] : best[l];
            action[l] = better ? a : action[l];
        }
}

static void gumbel_interior_group(const Search *s, const int64_t *base, const float *raw, int64_t *action) {
    const int64_t A = s->actions;
    float c[MAX_ACTIONS][G], top[G], norm[G], denom[G];
    int32_t vis[MAX_ACTIONS][G], total[G];
    float logits[MAX_ACTIONS][G];
    completed_group(s, base, raw, &s->interior_q, c, vis, total);
    for (int l = 0; l < G; l++)
        for (int64_t a = 0; a < A; a++) logits[a][l] = s->children_prior_logits[base[l] + a];
    for (int64_t a = 0; a < A; a++)
        for (int l = 0; l < G; l++) c[a][l] = logits[a][l] + c[a][l];
    for (int l = 0; l < G; l++) top[l] = c[0][l];
    for (int64_t a = 1; a < A; a++)
        for (int l = 0; l < G; l++) top[l] = fmax_chain(top[l], c[a][l]);
    for (int64_t a = 0; a < A; a++) {
        for (int l = 0; l < G; l++) c[a][l] = c[a][l] - top[l];
        exp_row(s->exp8, c[a], G);
    }
    for (int l = 0; l < G; l++) { norm[l] = c[0][l]; denom[l] = (float)(1 + (int64_t)total[l]); }
    for (int64_t a = 1; a < A; a++)
        for (int l = 0; l < G; l++) norm[l] = norm[l] + c[a][l];
    for (int64_t a = 0; a < A; a++)
        for (int l = 0; l < G; l++) c[a][l] = c[a][l] / norm[l] - (float)vis[a][l] / denom[l];
    argmax_group(s, c, action);
}

static void gumbel_root_group(const Search *s, const int64_t *tree, int64_t *action) {
    const int64_t A = s->actions;
    float c[MAX_ACTIONS][G], raw[G], top[G];
    int32_t vis[MAX_ACTIONS][G], total[G];
    int64_t base[G], considered[G];
    for (int l = 0; l < G; l++) { base[l] = tree[l] * s->nodes * A; raw[l] = s->raw_values[tree[l] * s->nodes]; }
    completed_group(s, base, raw, &s->root_q, c, vis, total);
    for (int l = 0; l < G; l++) {
        int64_t num_valid = 0;
        for (int64_t a = 0; a < A; a++) num_valid += !s->root_invalid[tree[l] * A + a];
        considered[l] = s->table[(num_valid < s->max_considered ? num_valid : s->max_considered) * s->table_cols
                                 + total[l]];
        top[l] = s->children_prior_logits[base[l]];
    }
    for (int64_t a = 1; a < A; a++)
        for (int l = 0; l < G; l++) top[l] = fmax_chain(top[l], s->children_prior_logits[base[l] + a]);
    for (int64_t a = 0; a < A; a++)
        for (int l = 0; l < G; l++) {
            float x = s->root_gumbel[tree[l] * A + a] + (s->children_prior_logits[base[l] + a] - top[l]) + c[a][l];
            x = x < -1e9f ? -1e9f : x;
            x = x + (vis[a][l] == considered[l] ? 0.0f : -INFINITY);
            c[a][l] = s->root_invalid[tree[l] * A + a] ? -INFINITY : x;
        }
    argmax_group(s, c, action);
}

/* the Gumbel descent, level by level over the trees still descending, G at a time */
static void descend_gumbel(const Search *s, int64_t limit) {
    const int64_t B = s->batch, N = s->nodes, A = s->actions;
    int64_t *trees = s->work, *nodes = s->work + B, count = 0;
    for (int64_t start = 0; start < B; start += G) {
        int64_t lane_tree[G], action[G];
        const int64_t g = B - start < G ? B - start : G;
        for (int l = 0; l < G; l++) lane_tree[l] = start + (l < g ? l : 0);
        gumbel_root_group(s, lane_tree, action);
        for (int64_t l = 0; l < g; l++) {
            const int64_t b = start + l, next = s->children_index[b * N * A + action[l]];
            s->out[b] = 0;
            s->out[B + b] = action[l];
            s->out[2 * B + b] = 1;
            if (next != -1 && 1 < limit) { trees[count] = b; nodes[count] = next; count++; }
        }
    }
    while (count > 0) {
        int64_t kept = 0;
        for (int64_t start = 0; start < count; start += G) {
            int64_t base[G], action[G];
            float raw[G];
            const int64_t g = count - start < G ? count - start : G;
            for (int l = 0; l < G; l++) {
                const int64_t i = start + (l < g ? l : 0);
                base[l] = (trees[i] * N + nodes[i]) * A;
                raw[l] = s->raw_values[trees[i] * N + nodes[i]];
            }
            gumbel_interior_group(s, base, raw, action);
            for (int64_t l = 0; l < g; l++) {
                const int64_t b = trees[start + l], node = nodes[start + l];
                const int64_t depth = s->out[2 * B + b] + 1, next = s->children_index[(b * N + node) * A + action[l]];
                s->out[b] = node;
                s->out[B + b] = action[l];
                s->out[2 * B + b] = depth;
                if (next != -1 && depth < limit) { trees[kept] = b; nodes[kept] = next; kept++; }
            }
        }
        count = kept;
    }
}

/* The descent of every tree at simulation sim: out[0] parent, out[1] action, out[2] depth
 * (edges) of the expansion, and the parents' embedding rows gathered into emb_buf. */
void steersman_descend(const Search *s, int64_t sim) {
    const int64_t B = s->batch, N = s->nodes, A = s->actions;
    const int64_t limit = s->max_depth < sim + 1 ? s->max_depth : sim + 1;
    const float *uniform = s->uniforms ? s->uniforms + sim * B * A : 0;
    if (sim == 0)
        for (int64_t b = 0; b < B; b++) cache_prior_probs(s, b, 0);
    if (s->kind == SELECT_GUMBEL) descend_gumbel(s, limit);
    if (s->kind == SELECT_GUMBEL) memcpy(s->expanded + sim * B, s->out + B, (size_t)B * sizeof(int64_t));
    for (int64_t b = 0; b < B; b++) {
        if (s->kind == SELECT_PUCT) {
            int64_t node = 0, depth = 1, action = puct(s, b, 0, 0, uniform + b * A);
            int64_t next = s->children_index[b * N * A + action];
            while (next != -1 && depth < limit) {
                node = next;
                action = puct(s, b, node, depth, uniform + b * A);
                depth += 1;
                next = s->children_index[(b * N + node) * A + action];
            }
            s->out[b] = node;
            s->out[B + b] = action;
            s->out[2 * B + b] = depth;
            s->expanded[sim * B + b] = action;
        }
        for (int64_t k = 0; k < s->num_leaves; k++) {
            const int64_t row = s->emb_row_bytes[k];
            memcpy(s->emb_buf[k] + b * row, s->emb_store[k] + (b * N + s->out[b]) * row, (size_t)row);
        }
    }
}

/* The expansion's writes (node sim + 1, or the existing child where max_depth stopped the
 * descent) from the model's outputs (s->step, s->next), then the backup from the new node
 * to the root. */
void steersman_expand_backup(const Search *s, int64_t sim) {
    const int64_t B = s->batch, N = s->nodes, A = s->actions;
    const float *reward = s->step[0], *discount = s->step[1], *logits = s->step[2], *value = s->step[3];
    const int64_t sr = s->step_stride[0], sd = s->step_stride[1], sl = s->step_stride[2], sv = s->step_stride[3];
    char *const *next = s->next;
    for (int64_t b = 0; b < B; b++) {
        const int64_t parent = s->out[b], action = s->out[B + b], depth = s->out[2 * B + b];
        const int64_t edge = (b * N + parent) * A + action;
        int64_t nn = s->children_index[edge], node, act;
        const float leaf = value[b * sv];
        float ret = leaf, child_value = leaf;
        if (nn == -1) nn = sim + 1;
        memcpy(s->children_prior_logits + (b * N + nn) * A, logits + b * sl, (size_t)A * sizeof(float));
        cache_prior_probs(s, b, nn);
        s->raw_values[b * N + nn] = leaf;
        s->node_values[b * N + nn] = leaf;
        s->node_visits[b * N + nn] += 1;
        s->depth[b * N + nn] = depth;
        for (int64_t k = 0; k < s->num_leaves; k++) {
            const int64_t row = s->emb_row_bytes[k];
            memcpy(s->emb_store[k] + (b * N + nn) * row, next[k] + b * row, (size_t)row);
        }
        s->children_index[edge] = nn;
        s->children_rewards[edge] = reward[b * sr];
        s->children_discounts[edge] = discount[b * sd];
        s->parents[b * N + nn] = parent;
        s->action_from_parent[b * N + nn] = action;
        /* backup: returns from the leaf up, running means of the path's nodes */
        node = parent;
        act = action;
        while (node != -1) {
            const int64_t e = (b * N + node) * A + act;
            const int32_t count = s->node_visits[b * N + node];
            ret = s->children_rewards[e] + s->children_discounts[e] * ret;
            s->children_values[e] = child_value;
            s->qvalues[e] = s->children_rewards[e] + s->children_discounts[e] * child_value;
            s->children_visits[e] += 1;
            child_value = (s->node_values[b * N + node] * (float)count + ret) / ((float)count + 1.0f);
            s->node_values[b * N + node] = child_value;
            s->node_visits[b * N + node] = count + 1;
            act = s->action_from_parent[b * N + node];
            node = s->parents[b * N + node];
        }
    }
}
