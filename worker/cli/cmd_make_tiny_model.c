/* `llmq make-tiny-model DIR [options]`: a random checkpoint in Hugging Face layout (engine/tiny_model.h). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tiny_model.h"
#include "worker/cli/cli.h"
#include "worker/cli/progress.h"

static const char CMD[] = "make-tiny-model";

static void usage(FILE *f)
{
    struct tiny_opts d = tiny_opts_default();
    fprintf(
        f,
        "Usage: llmq make-tiny-model DIR [options]\n\n"
        "Writes a random checkpoint in Hugging Face layout into DIR: config.json, generation_config.json,\n"
        "tokenizer.json, tokenizer_config.json and model.safetensors (or shards + index). The same options\n"
        "always give byte-identical files.\n\n"
        "Options:\n"
        "  --arch A           qwen3 | qwen2 (q/k/v biases, no q/k norm) | llama (default qwen3; with\n"
        "                     --tokenizer, qwen3 for a Qwen tokenizer and llama for others)\n"
        "  --hidden N         hidden size (default %d)\n"
        "  --intermediate N   MLP size (default %d)\n"
        "  --layers N         layers (default %d)\n"
        "  --heads N          attention heads (default %d)\n"
        "  --kv-heads N       key/value heads, dividing --heads (default %d)\n"
        "  --head-dim N       head size (default hidden / heads)\n"
        "  --vocab N          vocabulary size (default 512; with --tokenizer 151936 for Qwen's, else its\n"
        "                     highest id + 1 rounded up to a multiple of 128)\n"
        "  --max-position N   max_position_embeddings (default %d)\n"
        "  --rope-theta X     RoPE base (default %g)\n"
        "  --tie | --no-tie   tie lm_head to the embeddings (default --tie)\n"
        "  --experts N        a Qwen3-MoE (Qwen3MoeForCausalLM) with N experts per MoE layer (default 0:\n"
        "                     dense)\n"
        "  --experts-per-token K  experts each token is routed to (default %d)\n"
        "  --moe-intermediate N   each expert's MLP size (default: --intermediate)\n"
        "  --norm-topk-prob | --no-norm-topk-prob  renormalize the K routing weights (default on)\n"
        "  --decoder-sparse-step N  layer l is MoE when (l + 1) %% N == 0 (default 1)\n"
        "  --mlp-only-layers L,L,...  layers that keep the dense MLP of --intermediate (default none)\n"
        "  --dtype T          bf16 | f16 | f32 | fp8 (F8_E4M3 linear weights, 128x128 block scales) (default "
        "bf16)\n"
        "  --shards N         split the weights into N files with an index (default 1)\n"
        "  --seed N           random seed (default 0)\n"
        "  --threads N        threads drawing the weights (default: one per CPU, at most 16); the files\n"
        "                     do not depend on it. A progress bar shows on a terminal.\n"
        "  --tokenizer DIR    copy tokenizer.json and tokenizer_config.json from DIR, a tokenizer llmq\n"
        "                     loads: Qwen2/2.5/3, Llama-3.x, DeepSeek-V3/R1 (default: write a\n"
        "                     minimal byte-level BPE tokenizer with <|endoftext|>, <|im_start|>, "
        "<|im_end|>)\n"
        "  -h, --help         this text\n",
        d.hidden, d.intermediate, d.layers, d.heads, d.kv_heads, d.max_position, d.rope_theta,
        d.experts_per_token);
}

static int parse_int(const char *flag, const char *s, int *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < -0x7fffffffLL || v > 0x7fffffffLL)
        return cli_usage_error(CMD, "%s: '%s' is not an integer", flag, s);
    *out = (int)v;
    return 0;
}

/* "3,5,7": sets those bits of only[]; each a layer index below MODEL_MAX_MOE_LAYERS. */
static int parse_layers(const char *s, uint64_t *only)
{
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v >= MODEL_MAX_MOE_LAYERS || (*end && *end != ','))
            return cli_usage_error(CMD, "--mlp-only-layers: '%s' is not a list of layer indices below %d", s,
                                   MODEL_MAX_MOE_LAYERS);
        only[v / 64] |= (uint64_t)1 << (v % 64);
        if (!*end)
            return 0;
        p = end + 1;
    }
}

static void show_progress(void *arg, uint64_t done, uint64_t total)
{
    progress_set_total(arg, (int64_t)(total >> 20));
    progress_update(arg, (int64_t)(done >> 20), (int64_t)(done >> 20));
}

int cmd_make_tiny_model(int argc, char **argv)
{
    enum {
        O_HIDDEN = 256,
        O_INTER,
        O_LAYERS,
        O_HEADS,
        O_KV,
        O_HEAD_DIM,
        O_VOCAB,
        O_MAXPOS,
        O_THETA,
        O_TIE,
        O_NO_TIE,
        O_ARCH,
        O_DTYPE,
        O_SHARDS,
        O_SEED,
        O_TOK,
        O_THREADS,
        O_EXPERTS,
        O_EXPERTS_K,
        O_MOE_INTER,
        O_NORM_TOPK,
        O_NO_NORM_TOPK,
        O_SPARSE_STEP,
        O_MLP_ONLY
    };
    static const struct option longopts[] = {{"hidden", required_argument, NULL, O_HIDDEN},
                                             {"intermediate", required_argument, NULL, O_INTER},
                                             {"layers", required_argument, NULL, O_LAYERS},
                                             {"heads", required_argument, NULL, O_HEADS},
                                             {"kv-heads", required_argument, NULL, O_KV},
                                             {"head-dim", required_argument, NULL, O_HEAD_DIM},
                                             {"vocab", required_argument, NULL, O_VOCAB},
                                             {"max-position", required_argument, NULL, O_MAXPOS},
                                             {"rope-theta", required_argument, NULL, O_THETA},
                                             {"tie", no_argument, NULL, O_TIE},
                                             {"no-tie", no_argument, NULL, O_NO_TIE},
                                             {"arch", required_argument, NULL, O_ARCH},
                                             {"dtype", required_argument, NULL, O_DTYPE},
                                             {"shards", required_argument, NULL, O_SHARDS},
                                             {"seed", required_argument, NULL, O_SEED},
                                             {"tokenizer", required_argument, NULL, O_TOK},
                                             {"threads", required_argument, NULL, O_THREADS},
                                             {"experts", required_argument, NULL, O_EXPERTS},
                                             {"experts-per-token", required_argument, NULL, O_EXPERTS_K},
                                             {"moe-intermediate", required_argument, NULL, O_MOE_INTER},
                                             {"norm-topk-prob", no_argument, NULL, O_NORM_TOPK},
                                             {"no-norm-topk-prob", no_argument, NULL, O_NO_NORM_TOPK},
                                             {"decoder-sparse-step", required_argument, NULL, O_SPARSE_STEP},
                                             {"mlp-only-layers", required_argument, NULL, O_MLP_ONLY},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    struct tiny_opts o = tiny_opts_default();
    static const char shortopts[] = "h";
    int c, rc = 0;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        switch (c) {
        case 'h':
            usage(stdout);
            return 0;
        case O_HIDDEN:
            rc = parse_int("--hidden", optarg, &o.hidden);
            break;
        case O_INTER:
            rc = parse_int("--intermediate", optarg, &o.intermediate);
            break;
        case O_LAYERS:
            rc = parse_int("--layers", optarg, &o.layers);
            break;
        case O_HEADS:
            rc = parse_int("--heads", optarg, &o.heads);
            break;
        case O_KV:
            rc = parse_int("--kv-heads", optarg, &o.kv_heads);
            break;
        case O_HEAD_DIM:
            rc = parse_int("--head-dim", optarg, &o.head_dim);
            if (!rc && o.head_dim < 1)
                rc = cli_usage_error(CMD, "--head-dim must be at least 1");
            break;
        case O_VOCAB:
            rc = parse_int("--vocab", optarg, &o.vocab);
            if (!rc && o.vocab < 1)
                rc = cli_usage_error(CMD, "--vocab must be at least 1");
            break;
        case O_MAXPOS:
            rc = parse_int("--max-position", optarg, &o.max_position);
            break;
        case O_SHARDS:
            rc = parse_int("--shards", optarg, &o.shards);
            break;
        case O_THREADS:
            rc = parse_int("--threads", optarg, &o.threads);
            if (!rc && (o.threads < 1 || o.threads > 64))
                rc = cli_usage_error(CMD, "--threads %d is out of range [1, 64]", o.threads);
            break;
        case O_THETA: {
            char *end;
            errno = 0;
            o.rope_theta = strtod(optarg, &end);
            if (errno || end == optarg || *end)
                rc = cli_usage_error(CMD, "--rope-theta: '%s' is not a number", optarg);
            break;
        }
        case O_SEED: {
            char *end;
            errno = 0;
            o.seed = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end || optarg[0] == '-')
                rc = cli_usage_error(CMD, "--seed: '%s' is not a non-negative integer", optarg);
            break;
        }
        case O_EXPERTS:
            rc = parse_int("--experts", optarg, &o.experts);
            break;
        case O_EXPERTS_K:
            rc = parse_int("--experts-per-token", optarg, &o.experts_per_token);
            break;
        case O_MOE_INTER:
            rc = parse_int("--moe-intermediate", optarg, &o.moe_intermediate);
            if (!rc && o.moe_intermediate < 1)
                rc = cli_usage_error(CMD, "--moe-intermediate must be at least 1");
            break;
        case O_NORM_TOPK:
            o.norm_topk_prob = true;
            break;
        case O_NO_NORM_TOPK:
            o.norm_topk_prob = false;
            break;
        case O_SPARSE_STEP:
            rc = parse_int("--decoder-sparse-step", optarg, &o.decoder_sparse_step);
            break;
        case O_MLP_ONLY:
            rc = parse_layers(optarg, o.mlp_only);
            break;
        case O_TIE:
            o.tie = true;
            break;
        case O_NO_TIE:
            o.tie = false;
            break;
        case O_ARCH:
            o.arch_from_tokenizer = false;
            if (!strcmp(optarg, "qwen3"))
                o.arch = ARCH_QWEN3;
            else if (!strcmp(optarg, "qwen2"))
                o.arch = ARCH_QWEN2;
            else if (!strcmp(optarg, "llama"))
                o.arch = ARCH_LLAMA;
            else
                rc = cli_usage_error(CMD, "--arch: '%s' is not qwen3, qwen2 or llama", optarg);
            break;
        case O_DTYPE:
            if (!strcmp(optarg, "bf16"))
                o.dtype = DT_BF16;
            else if (!strcmp(optarg, "f16"))
                o.dtype = DT_F16;
            else if (!strcmp(optarg, "f32"))
                o.dtype = DT_F32;
            else if (!strcmp(optarg, "fp8"))
                o.dtype = DT_F8_E4M3;
            else
                rc = cli_usage_error(CMD, "--dtype: '%s' is not bf16, f16, f32 or fp8", optarg);
            break;
        case O_TOK:
            o.tokenizer_dir = optarg;
            break;
        default:
            return cli_bad_option(CMD, argc, argv, longopts, shortopts);
        }
        if (rc)
            return rc;
    }
    if (optind >= argc)
        return cli_usage_error(CMD, "missing the output folder DIR");
    if (optind + 1 < argc)
        return cli_usage_error(CMD, "one output folder expected, got '%s' and '%s'", argv[optind],
                               argv[optind + 1]);
    const char *dir = argv[optind];
    char err[1024];
    struct progress *bar = progress_new(stderr, "MB", 0);
    if (progress_active(bar)) {
        progress_set_rate_unit(bar, "MB/s");
        o.progress = show_progress;
        o.progress_arg = bar;
    }
    rc = tiny_model_write(dir, &o, err, sizeof err);
    progress_finish(bar);
    progress_free(bar);
    if (rc == TINY_EBADOPT)
        return cli_usage_error(CMD, "%s", err);
    if (rc < 0) {
        fprintf(stderr, "llmq %s: %s\n", CMD, err);
        return 1;
    }
    printf("wrote %s\n", dir);
    return 0;
}
