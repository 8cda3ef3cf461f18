/* FP8 accuracy of the CUDA backend, measured: bf16 weights + bf16 KV cache (the reference) against
 * fp8 weights (backend_opts.weight_dtype = BE_WEIGHTS_FP8), fp8 KV cache (kv_dtype = DT_F8_E4M3) and
 * both, and fp8 weights on the GPU against the CPU oracle computing with the same fp8 weights.
 *
 * Protocol (teacher-forced): a few random prompts are prefilled in one step, then the reference
 * configuration decodes greedily for NGEN tokens; every other configuration is fed the same prompt
 * and the reference's tokens, so all see the same contexts, and at every generated position each
 * returns its greedy token and its top-20 logprobs. Per (model, configuration), against the
 * reference, one line:
 *   chosen   |dlogprob| of the reference's token (mean, p99; when it falls out of the other's top 20
 *            its 20th logprob stands in, an underestimate, and the count is printed)
 *   top20    |dlogprob| over the reference's top-20 ids found in the other's top 20 (mean, p99)
 *   greedy   agreement of the greedy tokens, overall and where the reference's top-2 gap > 0.1
 * Decode steps run as CUDA graphs (the fp8 path under capture), prefill eagerly.
 *
 * Models: the three tiny fixtures of tests/fixtures/models/models.json (head_dim 16 and 32, which
 * the CUDA attention kernels do not support (64 and 128 only): each prints a "skipped" line; a model
 * of any other head_dim is skipped the same way), 128-aligned tiny Qwen3 shapes (bf16 checkpoints
 * quantized at load, and an fp8 checkpoint written by tiny_model_write as Qwen3-*-FP8 ship), and
 * Qwen3-14B shapes with random weights (engine/random_model.h: 40 random layers give near-uniform,
 * chaotic next-token distributions that amplify any perturbation, so greedy agreement there measures
 * the model, not fp8: its bars are printed as "info", never failed).
 *
 * The output projection in fp8 (model.lm_head_dtype), on models whose vocab and hidden size are
 * multiples of 128: "fp8 weights + lm_head" against the reference, "fp8 lm_head alone" against fp8
 * weights (the same layers and contexts: what the projection alone moves), and against the CPU oracle
 * with the same fp8 projection over bf16 layers, with 12 sequences (the cuBLASLt path as well as the GEMV).
 *
 * Bars (loose sanity: they fail on a broken path, not on fp8's own error; the numbers go into
 * docs/CUDA_BACKEND.md), on the tiny aligned models: every fp8 configuration has mean chosen
 * |dlogprob| < 0.5 and greedy agreement > 50%; against the CPU oracle (emulate_cuda with the same
 * fp8 weights) the same, and on bf16 checkpoints quantized at load the GPU's fp8 forward must be
 * closer to the fp8 oracle than to the bf16 oracle (else it is not using the oracle's fp8 values). fp8 KV
 * configurations print "not implemented" and are skipped when the backend refuses them. Skips (exit 77)
 * without a usable GPU. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/backend.h"
#ifdef LLMQ_HAVE_CUDA_BACKEND
#include "engine/cuda_backend.h"
#endif
#include "engine/gpu.h"
#include "engine/model.h"
#include "engine/random_model.h"
#include "engine/tiny_model.h"
#include "engine/util/log.h"
#include "engine/util/scratch_dir.h"
#include "testutil.h"
#include "worker/backends/backend_open.h"

#define BS 32
#define TOP 20
#define GAP 0.1f

static int n_fail = 0;

/* What one configuration returned at every generated position: [seq][j]. */
struct trace {
    int n_seq, n_gen;
    int32_t *tok;  /* greedy token */
    int32_t *ids;  /* [.. * TOP] */
    float *lp;     /* [.. * TOP] */
    float *tok_lp; /* logprob of tok */
};

static void trace_free(struct trace *t)
{
    free(t->tok), free(t->ids), free(t->lp), free(t->tok_lp);
    memset(t, 0, sizeof *t);
}

#define MAXSEQ 12 /* the lm_head cases: more logits rows than the GEMV takes (K_GEMV_MAX_M) */

struct prompts {
    int n_seq, n_gen;
    int n_prompt[MAXSEQ];
    int32_t *tok[MAXSEQ]; /* prompt then the reference's generated tokens */
};

/* Runs prompts through be: one prefill step, then n_gen - 1 decode steps. With teacher set, the
 * generated tokens are taken from p (the reference's); else be's greedy tokens are written into p.
 * Returns 0, or -1 after printing why. */
static int drive(struct backend *be, struct prompts *p, bool teacher, struct trace *t, const char *what)
{
    const int S = p->n_seq, G = p->n_gen;
    t->n_seq = S, t->n_gen = G;
    t->tok = calloc((size_t)S * G, sizeof *t->tok);
    t->ids = calloc((size_t)S * G * TOP, sizeof *t->ids);
    t->lp = calloc((size_t)S * G * TOP, sizeof *t->lp);
    t->tok_lp = calloc((size_t)S * G, sizeof *t->tok_lp);
    int max_len = 0;
    for (int s = 0; s < S; s++)
        max_len = p->n_prompt[s] + G > max_len ? p->n_prompt[s] + G : max_len;
    const int nbs = (max_len + BS - 1) / BS;
    if (be->num_blocks < S * nbs) {
        printf("FAIL %s: %d KV blocks, %d needed\n", what, be->num_blocks, S * nbs);
        n_fail++;
        return -1;
    }
    int32_t *bt = malloc((size_t)S * nbs * sizeof *bt);
    struct sampling_params sp = sampling_params_default();
    sp.temperature = 0, sp.logprobs = TOP;
    struct be_seq seqs[MAXSEQ];
    struct be_out out[MAXSEQ];
    for (int s = 0; s < S; s++)
        for (int i = 0; i < nbs; i++)
            bt[s * nbs + i] = s * nbs + i;
    for (int j = 0; j < G; j++) {
        for (int s = 0; s < S; s++) {
            struct be_seq *q = &seqs[s];
            memset(q, 0, sizeof *q);
            q->tokens = p->tok[s];
            q->n_prompt = p->n_prompt[s];
            q->n_tokens = p->n_prompt[s] + j;
            q->pos = j == 0 ? 0 : q->n_tokens - 1;
            q->n_new = j == 0 ? p->n_prompt[s] : 1;
            q->block_table = bt + s * nbs;
            q->n_blocks = nbs;
            q->sample = true;
            q->sp = &sp;
        }
        if (backend_step(be, seqs, S, out)) {
            printf("FAIL %s: step %d: %s\n", what, j, be->err);
            n_fail++;
            free(bt);
            return -1;
        }
        for (int s = 0; s < S; s++) {
            const size_t k = (size_t)s * G + j;
            t->tok[k] = out[s].token;
            t->tok_lp[k] = out[s].logprob;
            for (int i = 0; i < TOP; i++) {
                t->ids[k * TOP + i] = i < out[s].n_top ? out[s].top_ids[i] : -1;
                t->lp[k * TOP + i] = i < out[s].n_top ? out[s].top_logprobs[i] : -INFINITY;
            }
            if (!teacher)
                p->tok[s][p->n_prompt[s] + j] = out[s].token;
        }
    }
    free(bt);
    return 0;
}

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static float p99(float *v, int n)
{
    if (n == 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_f);
    int i = (int)ceil(0.99 * n) - 1;
    return v[i < 0 ? 0 : i];
}

struct stats {
    double chosen_mean, top_mean, agree, agree_gap;
    float chosen_p99, top_p99;
    int n, missing, top_pairs, top_missing, n_gap;
};

static struct stats compare(const struct trace *ref, const struct trace *x)
{
    struct stats st;
    memset(&st, 0, sizeof st);
    const int N = ref->n_seq * ref->n_gen;
    float *dc = malloc((size_t)N * sizeof *dc), *dt = malloc((size_t)N * TOP * sizeof *dt);
    int agree = 0, agree_gap = 0;
    for (int k = 0; k < N; k++) {
        const int32_t *ri = ref->ids + (size_t)k * TOP, *xi = x->ids + (size_t)k * TOP;
        const float *rl = ref->lp + (size_t)k * TOP, *xl = x->lp + (size_t)k * TOP;
        /* the reference's chosen token in x's top 20 */
        float xv = xl[TOP - 1];
        bool found = false;
        for (int i = 0; i < TOP; i++)
            if (xi[i] == ref->tok[k]) {
                xv = xl[i], found = true;
                break;
            }
        st.missing += !found;
        dc[k] = fabsf(xv - ref->tok_lp[k]);
        st.chosen_mean += dc[k];
        for (int i = 0; i < TOP; i++) {
            if (ri[i] < 0)
                continue;
            int f = -1;
            for (int j = 0; j < TOP; j++)
                if (xi[j] == ri[i])
                    f = j;
            if (f < 0) {
                st.top_missing++;
                continue;
            }
            dt[st.top_pairs] = fabsf(xl[f] - rl[i]);
            st.top_mean += dt[st.top_pairs++];
        }
        agree += x->tok[k] == ref->tok[k];
        if (rl[0] - rl[1] > GAP) {
            st.n_gap++;
            agree_gap += x->tok[k] == ref->tok[k];
        }
    }
    st.n = N;
    st.chosen_mean /= N;
    st.top_mean = st.top_pairs ? st.top_mean / st.top_pairs : 0;
    st.chosen_p99 = p99(dc, N);
    st.top_p99 = p99(dt, st.top_pairs);
    st.agree = (double)agree / N;
    st.agree_gap = st.n_gap ? (double)agree_gap / st.n_gap : 1;
    free(dc), free(dt);
    return st;
}

static void print_stats(const char *model, const char *cfg, const struct stats *s)
{
    printf("%-22s %-26s chosen |dlp| mean %.4f p99 %.4f (%d of %d out of top 20)  top20 |dlp| mean %.4f p99 "
           "%.4f (%d pairs, %d missing)  greedy agreement %.1f%% (%.1f%% of %d with top-2 gap > %.1f)\n",
           model, cfg, s->chosen_mean, s->chosen_p99, s->missing, s->n, s->top_mean, s->top_p99, s->top_pairs,
           s->top_missing, 100 * s->agree, 100 * s->agree_gap, s->n_gap, GAP);
}

/* The sanity bars; judge_all: greedy agreement overall too (not on flat random 14B distributions);
 * informational: printed ("info", with what the bars would say), never a failure. */
static void judge(const char *model, const char *cfg, const struct stats *s, bool judge_all,
                  bool informational)
{
    bool ok = s->chosen_mean < 0.5 && (!judge_all || s->agree > 0.5) && (s->n_gap < 10 || s->agree_gap > 0.5);
    printf("%s %s %s: mean chosen |dlp| %.4f (< 0.5), greedy agreement %.1f%%%s (> 50%%)%s\n",
           informational ? "info"
           : ok          ? "ok  "
                         : "FAIL",
           model, cfg, s->chosen_mean, 100 * (judge_all ? s->agree : s->agree_gap),
           judge_all ? "" : " where the gap is clear",
           informational ? (ok ? " [within the bars; informational]"
                               : " [outside the bars; informational: random weights, chaotic distributions]")
                         : "");
    n_fail += !ok && !informational;
}

/* engine.decode_weight_copies of the GPU runs: auto (as the engine) unless tiled_same says */
static enum be_copies g_copies = BE_COPIES_AUTO;
/* engine.gemm_tuning_file of the GPU runs: none unless tiled_same says */
static const char *g_tuning = NULL;
/* k_linear's GEMV/cuBLASLt choice of the GPU runs (backend_test_opts.gemm_pick): timed unless tiled_same
 * says */
static enum be_gemm_pick g_pick = BE_GEMM_TIMED;

static struct backend_opts opts(const struct model *m, bool cpu, enum be_weights wd, enum be_weights lm,
                                bool kv8, int max_len, int n_seq)
{
    struct backend_opts o;
    memset(&o, 0, sizeof o);
    o.block_size = BS;
    o.max_num_seqs = n_seq > 8 ? MAXSEQ : 8;
    o.max_num_batched_tokens = 4096;
    o.max_model_len = max_len;
    o.gpu_memory_utilization = 0.9;
    /* enough for 8 sequences of max_len in fp32 (CPU); a cap on the GPU's pool (opens faster) */
    int64_t per_tok = (int64_t)m->cfg.n_layers * 2 * m->cfg.n_kv_heads * m->cfg.head_dim * 4;
    o.kv_cache_bytes = per_tok * (o.max_num_seqs * (int64_t)(max_len + BS)) + ((int64_t)1 << 20);
    o.kv_dtype = cpu ? DT_F32 : kv8 ? DT_F8_E4M3 : DT_BF16;
    /* the GPU's decode steps as graphs (LLMQ_TEST_GRAPHS=0: eager, to tell the two apart); the emulating
     * oracle mirrors their buckets */
    const char *graphs = getenv("LLMQ_TEST_GRAPHS");
    o.cuda_graphs = !(graphs && !strcmp(graphs, "0"));
    o.emulate_cuda = cpu;
    o.weight_dtype = wd;
    o.lm_head_dtype = lm;
    o.decode_weight_copies = g_copies;
    o.gemm_tuning_file = cpu ? NULL : g_tuning;
    o.test.gemm_pick = g_pick;
    return o;
}

/* Opens and drives one configuration; false when it could not open (printed). */
static bool run_cfg_lm(const struct model *m, const char *model, const char *cfg, bool cpu,
                       enum be_weights wd, enum be_weights lm, bool kv8, struct prompts *p, bool teacher,
                       struct trace *t, int max_len)
{
    struct backend_opts o = opts(m, cpu, wd, lm, kv8, max_len, p->n_seq);
    char err[512];
    struct backend *be = backend_open(cpu ? "cpu" : "cuda", m, &o, err, sizeof err);
    if (!be) {
        if (kv8 && (strstr(err, "not implemented") || strstr(err, "fp8 KV"))) {
            printf("skip %-17s %-26s fp8 KV cache: %s\n", model, cfg, err);
            return false;
        }
        printf("FAIL %s %s: open: %s\n", model, cfg, err);
        n_fail++;
        return false;
    }
    char what[128];
    snprintf(what, sizeof what, "%s %s", model, cfg);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = drive(be, p, teacher, t, what);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    backend_free(be);
    if (rc == 0)
        printf("     %-22s %-26s ran in %.2f s\n", model, cfg,
               (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
    return rc == 0;
}

/* run_cfg_lm with the output projection as the checkpoint has it (bf16 here) */
static bool run_cfg(const struct model *m, const char *model, const char *cfg, bool cpu, enum be_weights wd,
                    bool kv8, struct prompts *p, bool teacher, struct trace *t, int max_len)
{
    return run_cfg_lm(m, model, cfg, cpu, wd, BE_WEIGHTS_AUTO, kv8, p, teacher, t, max_len);
}

static void make_prompts(struct prompts *p, int n_seq, const int *lens, int n_gen, int vocab, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    p->n_seq = n_seq, p->n_gen = n_gen;
    for (int s = 0; s < n_seq; s++) {
        p->n_prompt[s] = lens[s];
        p->tok[s] = calloc((size_t)lens[s] + n_gen, sizeof(int32_t));
        for (int i = 0; i < lens[s]; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            p->tok[s][i] = (int32_t)((seed >> 33) % (uint64_t)(vocab < 150000 ? vocab : 150000));
        }
    }
}

static void prompts_free(struct prompts *p)
{
    for (int s = 0; s < p->n_seq; s++)
        free(p->tok[s]);
}

/* The four GPU configurations against bf16/bf16; fp8 bars on every fp8 one (random_big: the random
 * 14B model, bars informational and greedy agreement only where the top-2 gap is clear). */
static void gpu_configs(const struct model *m, const char *model, struct prompts *p, int max_len,
                        bool random_big)
{
    struct trace ref = {0};
    if (!run_cfg(m, model, "bf16 weights, bf16 KV", false, BE_WEIGHTS_BF16, false, p, false, &ref, max_len))
        return;
    const struct {
        const char *name;
        enum be_weights wd;
        bool kv8;
        enum be_weights lm;
    } cfgs[] = {{"bf16 weights, bf16 KV (2)", BE_WEIGHTS_BF16, false, BE_WEIGHTS_AUTO},
                {"fp8 weights, bf16 KV", BE_WEIGHTS_FP8, false, BE_WEIGHTS_AUTO},
                {"bf16 weights, fp8 KV", BE_WEIGHTS_BF16, true, BE_WEIGHTS_AUTO},
                {"fp8 weights, fp8 KV", BE_WEIGHTS_FP8, true, BE_WEIGHTS_AUTO},
                {"fp8 weights + lm_head", BE_WEIGHTS_FP8, false, BE_WEIGHTS_FP8}};
    const bool lm_ok = m->cfg.vocab % 128 == 0 && m->cfg.hidden % 128 == 0; /* else lm_head stays bf16 */
    struct trace fp8w = {0};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        struct trace t = {0};
        if (cfgs[i].lm == BE_WEIGHTS_FP8 && !lm_ok)
            continue;
        const bool ran = run_cfg_lm(m, model, cfgs[i].name, false, cfgs[i].wd, cfgs[i].lm, cfgs[i].kv8, p,
                                    true, &t, max_len);
        if (ran) {
            struct stats s = compare(&ref, &t);
            print_stats(model, cfgs[i].name, &s);
            if (i > 0)
                judge(model, cfgs[i].name, &s, !random_big, random_big);
            if (cfgs[i].lm == BE_WEIGHTS_FP8 && fp8w.tok) {
                /* the same layers and contexts: the output projection's fp8 alone */
                struct stats sl = compare(&fp8w, &t);
                print_stats(model, "fp8 lm_head alone", &sl);
            }
        }
        if (i == 1 && ran)
            fp8w = t;
        else
            trace_free(&t);
    }
    trace_free(&fp8w);
    trace_free(&ref);
}

/* CUDA against the CPU oracle computing with the same fp8 values (weights wd, output projection lm), and
 * against the oracle with what is fp8 there in bf16 (wd16, lm16); what names the fp8 part. The GPU must
 * meet the bars against the first and, with want_closer, be closer to it than to the second (else it is
 * not using the oracle's fp8 values). */
static void oracle_cmp(const struct model *m, const char *model, struct prompts *p, int max_len,
                       const char *what, enum be_weights wd, enum be_weights lm, enum be_weights wd16,
                       enum be_weights lm16, bool want_closer)
{
    char c8[64], c16[64], g8[64], v8[96], v16[96], vq[96];
    snprintf(c8, sizeof c8, "cpu oracle, fp8 %s", what);
    snprintf(c16, sizeof c16, "cpu oracle, bf16 %s", what);
    snprintf(g8, sizeof g8, "cuda, fp8 %s", what);
    snprintf(v8, sizeof v8, "cuda vs cpu, fp8 %s", what);
    snprintf(v16, sizeof v16, "cuda fp8 vs cpu bf16 %s", what);
    snprintf(vq, sizeof vq, "cpu: fp8 %s alone", what);
    struct trace cpu8 = {0}, cpu16 = {0}, gpu8 = {0};
    if (!run_cfg_lm(m, model, c8, true, wd, lm, false, p, false, &cpu8, max_len) ||
        !run_cfg_lm(m, model, c16, true, wd16, lm16, false, p, true, &cpu16, max_len) ||
        !run_cfg_lm(m, model, g8, false, wd, lm, false, p, true, &gpu8, max_len)) {
        trace_free(&cpu8), trace_free(&cpu16), trace_free(&gpu8);
        return;
    }
    struct stats s8 = compare(&cpu8, &gpu8), s16 = compare(&cpu16, &gpu8), sq = compare(&cpu16, &cpu8);
    print_stats(model, v8, &s8);
    print_stats(model, v16, &s16);
    print_stats(model, vq, &sq);
    judge(model, v8, &s8, true, false);
    const bool closer = s8.top_mean < s16.top_mean || !want_closer;
    printf(
        "%s %s: cuda with fp8 %s is closer to the oracle's fp8 (top20 mean %.4f) than to its bf16 (%.4f)\n",
        closer ? "ok  " : "FAIL", model, what, s8.top_mean, s16.top_mean);
    if (!want_closer) /* an fp8 checkpoint: its bf16 form differs from its fp8 values by one rounding only */
        printf("     (%s: informational: bf16 weights here are the fp8 values rounded to bf16)\n", model);
    n_fail += !closer;
    trace_free(&cpu8), trace_free(&cpu16), trace_free(&gpu8);
}

#ifdef LLMQ_HAVE_CUDA_BACKEND
int k_gemv_fp8_diag(int on); /* kernels/kernels.h (a CUDA header): the one-row fp8 GEMVs' mapping */
#endif

/* positions (seq, j) where two traces differ in any bit; the first one and the largest |dlogprob| of the
 * chosen token into *first / *worst */
static size_t trace_differ(const struct trace *a, const struct trace *b, size_t *first, float *worst)
{
    const size_t n = (size_t)a->n_seq * a->n_gen;
    size_t differ = 0;
    *first = n, *worst = 0.f;
    for (size_t i = 0; i < n; i++) {
        const bool d = a->tok[i] != b->tok[i] || memcmp(&a->tok_lp[i], &b->tok_lp[i], sizeof(float)) != 0 ||
                       memcmp(&a->ids[i * TOP], &b->ids[i * TOP], TOP * sizeof(int32_t)) != 0 ||
                       memcmp(&a->lp[i * TOP], &b->lp[i * TOP], TOP * sizeof(float)) != 0;
        if (d && differ++ == 0)
            *first = i;
        if (d && fabsf(a->tok_lp[i] - b->tok_lp[i]) > *worst)
            *worst = fabsf(a->tok_lp[i] - b->tok_lp[i]);
    }
    return differ;
}

/* engine.decode_weight_copies' rule (engine/weight_copies.h) at open, on the 14B shapes: auto makes the
 * copies for fp8 weights when the KV cache beside them holds max_num_seqs x max_model_len (8 x 1024)
 * and not when that is beyond any device (512 x 2048 tokens of 160 KiB: 168 GB), for fp8 weights (~14.8
 * GB: the layers and the bf16 output projection) and bf16 ones (~28 GB); on makes them whatever the
 * cache loses; off never. */
static void copies_rule(const struct model *m)
{
#ifdef LLMQ_HAVE_CUDA_BACKEND
    static const struct {
        const char *what;
        enum be_copies mode;
        enum be_weights wd;
        int seqs, max_len;
        bool want;
    } c[] = {
        {"auto, fp8, 8 x 1024", BE_COPIES_AUTO, BE_WEIGHTS_FP8, 8, 1024, true},
        {"auto, fp8, 512 x 2048", BE_COPIES_AUTO, BE_WEIGHTS_FP8, 512, 2048, false},
        {"on, fp8, 512 x 2048", BE_COPIES_ON, BE_WEIGHTS_FP8, 512, 2048, true},
        {"off, fp8, 8 x 1024", BE_COPIES_OFF, BE_WEIGHTS_FP8, 8, 1024, false},
        {"auto, bf16, 8 x 1024", BE_COPIES_AUTO, BE_WEIGHTS_BF16, 8, 1024, true},
        {"auto, bf16, 512 x 2048", BE_COPIES_AUTO, BE_WEIGHTS_BF16, 512, 2048, false},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        struct backend_opts o = opts(m, false, c[i].wd, BE_WEIGHTS_AUTO, false, c[i].max_len, 1);
        o.max_num_seqs = c[i].seqs;
        o.kv_cache_bytes = 0; /* the pool from gpu_memory_utilization, as the engine sizes it */
        o.decode_weight_copies = c[i].mode;
        char err[512];
        struct backend *be = backend_open("cuda", m, &o, err, sizeof err);
        struct cuda_backend_stats st;
        if (!be || cuda_backend_get_stats(be, &st)) {
            printf("FAIL copies rule: %s: open: %s\n", c[i].what, be ? "no stats" : err);
            n_fail++;
            backend_free(be);
            continue;
        }
        const bool ok = (st.copy_bytes > 0) == c[i].want;
        printf("%s copies rule: %s: %.2f GB of copies, KV cache %d blocks (%s)\n", ok ? "ok  " : "FAIL",
               c[i].what, (double)st.copy_bytes / 1e9, be->num_blocks,
               c[i].want ? "copies expected" : "none expected");
        n_fail += !ok;
        backend_free(be);
    }
#else
    (void)m;
#endif
}

/* The GEMVs on the copies of the weights in their read order (engine.decode_weight_copies on,
 * kernels/gemv.cu) compute the same products in the same order as the tile mapping on the row-major
 * matrices: fp8 weights, the prompts' reference tokens fed, every greedy token and top-20 logprob must be
 * the same bits with and without the copies. The runs take the GEMV wherever it can run
 * (backend_test_opts.gemm_pick: no timed choice against cuBLASLt, which the copies' speed could flip), the
 * tile mapping at one row (not the diagonal one, another summation order, which some devices take by
 * default), and one GEMM tuning file (engine.gemm_tuning_file): the first run writes the cuBLASLt
 * algorithms its prefill GEMMs timed, the others take them, so the row-major engine must repeat its own
 * bits (a second row-major run: the tuning file's promise) and the copies must give the same; a last
 * row-major run without the file says whether the algorithms timed afresh changed any bits (info). */
static void tiled_same(const struct model *m, const char *model, struct prompts *p, int max_len)
{
    char dir[600], tuning[700];
    if (scratch_dir_make(getenv("TMPDIR"), "test-tuning", dir, sizeof dir)) {
        printf("FAIL mkdtemp %s: %s\n", dir, strerror(errno));
        n_fail++;
        return;
    }
    snprintf(tuning, sizeof tuning, "%s/gemm.tuning", dir);
    g_tuning = tuning;
#ifdef LLMQ_HAVE_CUDA_BACKEND
    const int diag = k_gemv_fp8_diag(0);
#endif
    g_pick = BE_GEMM_GEMV;
    struct trace a = {0}, a2 = {0}, b = {0};
    g_copies = BE_COPIES_OFF;
    bool ok =
        run_cfg(m, model, "fp8 weights, row-major", false, BE_WEIGHTS_FP8, false, p, true, &a, max_len) &&
        run_cfg(m, model, "fp8 weights, row-major (2)", false, BE_WEIGHTS_FP8, false, p, true, &a2, max_len);
    g_copies = BE_COPIES_ON; /* the layers and the output projection */
    ok = ok &&
         run_cfg(m, model, "fp8 weights, tile copies", false, BE_WEIGHTS_FP8, false, p, true, &b, max_len);
    /* and once more without the file: the prefill GEMMs' algorithms timed afresh (info: cuBLASLt's timing
     * may pick another algorithm, another summation order, which the file is there to prevent) */
    struct trace a3 = {0};
    g_copies = BE_COPIES_OFF;
    g_tuning = NULL;
    ok = ok && run_cfg(m, model, "fp8 weights, row-major, no tuning file", false, BE_WEIGHTS_FP8, false, p,
                       true, &a3, max_len);
    g_copies = BE_COPIES_AUTO;
    scratch_dir_remove(dir);
    g_pick = BE_GEMM_TIMED;
#ifdef LLMQ_HAVE_CUDA_BACKEND
    k_gemv_fp8_diag(diag);
#endif
    if (ok) {
        size_t first, first2;
        float worst, worst2;
        const size_t n = (size_t)a.n_seq * a.n_gen, again = trace_differ(&a, &a2, &first2, &worst2),
                     differ = trace_differ(&a, &b, &first, &worst);
        printf("%s %s: the row-major run again, on the first run's GEMM tuning file: %zu of %zu positions "
               "differ (largest chosen |dlogprob| %.3g)\n",
               again ? "FAIL" : "ok  ", model, again, n, worst2);
        printf(
            "%s %s: the tile-order copies give the same tokens and top-20 logprobs bit for bit: %zu of %zu "
            "positions differ (the first at seq %zu, token %zu; largest chosen |dlogprob| %.3g)\n",
            differ ? "FAIL" : "ok  ", model, differ, n, first / a.n_gen, first % a.n_gen, worst);
        n_fail += (again != 0) + (differ != 0);
        size_t first3;
        float worst3;
        const size_t fresh = trace_differ(&a, &a3, &first3, &worst3);
        printf(
            "info %s: the row-major run again without the tuning file (algorithms timed afresh): %zu of %zu "
            "positions differ (largest chosen |dlogprob| %.3g)\n",
            model, fresh, n, worst3);
    }
    trace_free(&a), trace_free(&a2), trace_free(&a3), trace_free(&b);
}

struct tiny {
    const char *name;
    struct tiny_opts o;
    bool oracle;    /* also against the CPU oracle */
    bool lm_oracle; /* the fp8 output projection against the CPU oracle */
};

int main(void)
{
    char why[256];
    if (!gpu_backend_built() || gpu_describe(why, sizeof why) != 0) {
        printf("SKIPPED: no usable CUDA device (%s)\n", gpu_backend_built() ? why : "built without CUDA");
        return 77;
    }
    printf("device: %s\n", why);
    log_set_level(LOG_WARN);

    /* the fixtures of tests/fixtures/models/models.json, and 128-aligned shapes */
    struct tiny tinies[10];
    int nt = 0;
    struct tiny_opts o = tiny_opts_default();
    o.hidden = 64, o.intermediate = 160, o.layers = 2, o.heads = 4, o.kv_heads = 2, o.head_dim = 32,
    o.vocab = 512;
    o.tie = true, o.rope_theta = 10000, o.max_position = 4096, o.seed = 11;
    tinies[nt++] = (struct tiny){"qwen3_tied", o, false, false};
    o = tiny_opts_default();
    o.hidden = 96, o.intermediate = 256, o.layers = 3, o.heads = 8, o.kv_heads = 2, o.head_dim = 16,
    o.vocab = 640;
    o.tie = false, o.rope_theta = 1000000, o.max_position = 4096, o.seed = 22;
    tinies[nt++] = (struct tiny){"qwen3_untied_gqa4", o, false, false};
    o = tiny_opts_default();
    o.arch = ARCH_QWEN2, o.hidden = 64, o.intermediate = 128, o.layers = 2, o.heads = 4, o.kv_heads = 1;
    o.head_dim = 16, o.vocab = 512, o.tie = false, o.rope_theta = 100000, o.max_position = 4096, o.seed = 33;
    tinies[nt++] = (struct tiny){"qwen2_bias", o, false, false};
    o = tiny_opts_default();
    o.hidden = 256, o.heads = 8, o.kv_heads = 2, o.head_dim = 128, o.intermediate = 512, o.layers = 3;
    o.tie = false, o.vocab = 1000, o.seed = 1;
    tinies[nt++] = (struct tiny){"qwen3-aligned", o, true, false};
    o.dtype = DT_F8_E4M3, o.seed = 4;
    tinies[nt++] = (struct tiny){"qwen3-aligned-fp8ckpt", o, true, false};
    o = tiny_opts_default();
    o.arch = ARCH_QWEN2, o.hidden = 384, o.heads = 3, o.kv_heads = 1, o.head_dim = 128, o.intermediate = 1024;
    o.layers = 2, o.tie = true, o.vocab = 800, o.seed = 5;
    tinies[nt++] = (struct tiny){"qwen2-aligned-tied", o, true, false};
    /* vocab a multiple of 128: the output projection can be fp8 (model.lm_head_dtype) */
    o = tiny_opts_default();
    o.hidden = 256, o.heads = 4, o.kv_heads = 2, o.head_dim = 64, o.intermediate = 512, o.layers = 2;
    o.tie = false, o.vocab = 1024, o.seed = 6;
    tinies[nt++] = (struct tiny){"qwen3-aligned-v1024", o, false, true};
    o.tie = true, o.vocab = 768, o.seed = 7;
    tinies[nt++] = (struct tiny){"qwen3-aligned-tied-v768", o, false, true};

    const int lens[4] = {5, 64, 300, 777};
    for (int i = 0; i < nt; i++) {
        char dir[600], err[512];
        if (scratch_dir_make(getenv("TMPDIR"), "test-fp8", dir, sizeof dir)) {
            printf("FAIL mkdtemp %s: %s\n", dir, strerror(errno));
            return 1;
        }
        struct model *m = NULL;
        if (tiny_model_write(dir, &tinies[i].o, err, sizeof err) || !(m = model_load(dir, err, sizeof err))) {
            printf("FAIL %s: %s\n", tinies[i].name, err);
            n_fail++;
        } else if (m->cfg.head_dim != 64 && m->cfg.head_dim != 128) {
            printf("-- %s: skipped: head_dim %d: the CUDA attention kernels support 64 and 128\n",
                   tinies[i].name, m->cfg.head_dim);
        } else {
            const struct model_config *c = &m->cfg;
            bool aligned = c->hidden % 128 == 0 && c->intermediate % 128 == 0 &&
                           (c->n_heads * c->head_dim) % 128 == 0 && (c->n_kv_heads * c->head_dim) % 128 == 0;
            printf("-- %s: %s, hidden %d, %d layers, heads %d/%d x %d, vocab %d, %s checkpoint%s\n",
                   tinies[i].name, c->arch_name, c->hidden, c->n_layers, c->n_heads, c->n_kv_heads,
                   c->head_dim, c->vocab, c->fp8_blocks ? "fp8" : "bf16",
                   aligned
                       ? ""
                       : "; not 128-aligned: fp8 weights fall back to bf16 (the fp8 rows show fp8 KV alone)");
            struct prompts p;
            make_prompts(&p, 4, lens, 16, c->vocab, 1234 + (uint64_t)i);
            if (c->fp8_blocks) {
                /* an fp8 checkpoint: auto keeps it fp8 on the GPU, bf16 dequantizes it */
                struct trace ref = {0}, t = {0};
                if (run_cfg(m, tinies[i].name, "bf16 (dequantized)", false, BE_WEIGHTS_BF16, false, &p, false,
                            &ref, 1024) &&
                    run_cfg(m, tinies[i].name, "auto (fp8 as published)", false, BE_WEIGHTS_AUTO, false, &p,
                            true, &t, 1024)) {
                    struct stats s = compare(&ref, &t);
                    print_stats(tinies[i].name, "auto (fp8 as published)", &s);
                    judge(tinies[i].name, "auto (fp8 as published)", &s, true, false);
                }
                trace_free(&ref), trace_free(&t);
                oracle_cmp(m, tinies[i].name, &p, 1024, "weights", BE_WEIGHTS_AUTO, BE_WEIGHTS_AUTO,
                           BE_WEIGHTS_BF16, BE_WEIGHTS_AUTO, false);
            } else {
                gpu_configs(m, tinies[i].name, &p, 1024, false);
                if (tinies[i].oracle) {
                    oracle_cmp(m, tinies[i].name, &p, 1024, "weights", BE_WEIGHTS_FP8, BE_WEIGHTS_AUTO,
                               BE_WEIGHTS_BF16, BE_WEIGHTS_AUTO, true);
                    /* one sequence: its decode steps leave down's parts to the next norm (cb_forward) */
                    struct prompts p1;
                    make_prompts(&p1, 1, lens + 2, 24, c->vocab, 777 + (uint64_t)i);
                    oracle_cmp(m, tinies[i].name, &p1, 1024, "weights, one sequence", BE_WEIGHTS_FP8,
                               BE_WEIGHTS_AUTO, BE_WEIGHTS_BF16, BE_WEIGHTS_AUTO, true);
                    if (aligned) {
                        tiled_same(m, tinies[i].name, &p, 1024);
                        tiled_same(m, tinies[i].name, &p1, 1024);
                    }
                    prompts_free(&p1);
                }
            }
            prompts_free(&p);
            if (tinies[i].lm_oracle) {
                const int lens12[MAXSEQ] = {3, 9, 17, 30, 41, 64, 80, 100, 127, 150, 200, 260};
                make_prompts(&p, MAXSEQ, lens12, 12, c->vocab, 4321 + (uint64_t)i);
                /* the layers bf16, so that the two backends' spread (bf16 rounding) is small next to
                 * what the projection's fp8 moves; 12 sequences: the cuBLASLt path as well as the GEMV */
                oracle_cmp(m, tinies[i].name, &p, 1024, "lm_head", BE_WEIGHTS_BF16, BE_WEIGHTS_FP8,
                           BE_WEIGHTS_BF16, BE_WEIGHTS_BF16, true);
                prompts_free(&p);
            }
        }
        model_free(m);
        scratch_dir_remove(dir);
    }

    /* Qwen3-14B shapes, random weights on the device */
    struct model_config cfg;
    char err[512];
    if (random_model_config("qwen3-14b", &cfg, err, sizeof err)) {
        printf("FAIL qwen3-14b config: %s\n", err);
        return 1;
    }
    struct model *big = random_model_create(&cfg, false, err, sizeof err);
    if (!big) {
        printf("FAIL qwen3-14b: %s\n", err);
        return 1;
    }
    printf("-- qwen3-14b (random weights): hidden %d, %d layers, heads %d/%d x %d, vocab %d\n", cfg.hidden,
           cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab);
    const int big_lens[4] = {480, 500, 512, 530};
    struct prompts p;
    make_prompts(&p, 4, big_lens, 8, cfg.vocab, 99);
    gpu_configs(big, "qwen3-14b-random", &p, 1024, true);
    tiled_same(big, "qwen3-14b-random", &p, 1024);
    prompts_free(&p);
    copies_rule(big);
    const int big1[1] = {500}; /* one sequence: the one-row GEMVs, gate/up fused, down's parts */
    make_prompts(&p, 1, big1, 8, cfg.vocab, 98);
    struct trace t1 = {0}; /* writes the sequence's greedy tokens into p */
    if (run_cfg(big, "qwen3-14b-random", "fp8 weights (one sequence)", false, BE_WEIGHTS_FP8, false, &p,
                false, &t1, 1024))
        tiled_same(big, "qwen3-14b-random", &p, 1024);
    trace_free(&t1);
    prompts_free(&p);
    random_model_free(big);

    printf("%s: %d failures\n", n_fail ? "FAIL" : "ok", n_fail);
    return n_fail ? 1 : 0;
}
