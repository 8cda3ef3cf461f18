#!/usr/bin/env python3
"""The transformers peer of `llmq bench`: Hugging Face transformers on the same random-weight model
shapes and the same named workloads, one JSON line per run.

Every request gets a random prompt of exactly input_len token ids and generates exactly output_len
tokens (greedy, EOS ignored through min_new_tokens), as in `llmq bench`. The model is
`--random-weights SHAPE` (the shapes of engine/random_model.c: Qwen3 dense and Qwen3-MoE, random
weights of the same spread, made on the GPU) or `--model DIR` (a Hugging Face checkpoint). The JSON fields are named
as in `llmq bench`'s line where they mean the same (engine, model, workload, requests, input_len,
output_len, seconds, requests_per_s, output_tokens_per_s, total_tokens_per_s, weight_dtype,
kv_cache_dtype, gpu, failed), so the two lines join on `workload`. docs/PERFORMANCE.md lists the
commands behind every peer number there.

torch and transformers are imported only for a run, so `--help` and `--describe` work without them.
"""
import argparse
import json
import math
import os
import random
import sys
import time

# The named workloads of `llmq bench` (engine/bench.c): requests, prompt tokens, generated tokens.
WORKLOADS = {
    "chat": (1000, 512, 128),
    "decode": (512, 128, 1024),
    "summarize": (200, 4096, 256),
    "longdoc": (8, 65536, 256),
    "single": (1, 128, 512),
}

# The shapes of `llmq bench --random-weights` (engine/random_model.c), as Qwen3Config fields, or
# Qwen3MoeConfig fields where num_experts is given (every layer a mixture of experts with normalized top-k;
# intermediate_size is config.json's, unused without a dense layer).
SHAPES = {
    "qwen3-14b": dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40, num_attention_heads=40,
                      num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-30b-a3b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, tie_word_embeddings=False, num_experts=128,
                          num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
                          decoder_sparse_step=1, mlp_only_layers=[]),
}
# What every shape shares (engine/random_model.c): no q/k/v bias, q/k norms (always in Qwen3).
COMMON = dict(vocab_size=151936, max_position_embeddings=131072, rope_theta=1e6, rms_norm_eps=1e-6,
              attention_bias=False, eos_token_id=[151645, 151643], pad_token_id=151643)
WEIGHT_STD = 0.02         # random weights: uniform with this deviation, norm weights 1 (random_model.h)
PROMPT_ID_RANGE = 150000  # prompt ids come from [0, min(vocab, this)) (worker/cli/cmd_bench.c)
MODES = ("static", "compiled", "cb")
DTYPES = ("bf16", "fp16")


def is_moe(shape):
    """Whether a named shape is a Qwen3-MoE one."""
    return "num_experts" in SHAPES[shape]


def moe_layers(s):
    """How many layers of shape fields s are a mixture of experts (transformers' Qwen3MoeDecoderLayer rule)."""
    if not s.get("num_experts"):
        return 0
    return sum(1 for l in range(s["num_hidden_layers"])
               if l not in s["mlp_only_layers"] and (l + 1) % s["decoder_sparse_step"] == 0)


def shape_params(shape):
    """Parameters of a named shape, embedding, untied lm_head and MoE routers included (random_model_params's
    count)."""
    s = dict(COMMON, **SHAPES[shape])
    C, F, D, V = s["hidden_size"], s["intermediate_size"], s["head_dim"], s["vocab_size"]
    HD, KVD, L = s["num_attention_heads"] * D, s["num_key_value_heads"] * D, s["num_hidden_layers"]
    layer = 2 * C + (HD + 2 * KVD) * C + 2 * D + C * HD  # two norms, q/k/v, q/k norms, o
    n_moe = moe_layers(s)
    moe = s.get("num_experts", 0) * (C + 3 * s.get("moe_intermediate_size", 0) * C)  # router row, expert MLP
    return V * C * (1 if s["tie_word_embeddings"] else 2) + C + L * layer + (L - n_moe) * 3 * F * C + n_moe * moe


def describe():
    """The workloads and shapes this script uses, as one JSON-able dict (what --describe prints)."""
    return {
        "workloads": {w: dict(requests=n, input_len=i, output_len=o) for w, (n, i, o) in WORKLOADS.items()},
        "shapes": {s: dict(SHAPES[s], params=shape_params(s)) for s in SHAPES},
        "common": COMMON,
        "weight_std": WEIGHT_STD,
        "prompt_id_range": PROMPT_ID_RANGE,
    }


def parse_args(argv):
    """The command line; exits 2 (argparse's status) with a message when it is wrong."""
    table = "\n".join(f"  {w:<10} {n:>5} x {i:>6} in / {o:>5} out" for w, (n, i, o) in WORKLOADS.items())
    ap = argparse.ArgumentParser(
        prog="transformers_peer.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Runs a named `llmq bench` workload through Hugging Face transformers on the same model\n"
        "shapes and prints one JSON line per workload: requests/s, output and total tokens/s, seconds,\n"
        "the GPU and the torch and transformers versions. Prompts are random token ids; every request\n"
        "generates exactly its output length (greedy, EOS ignored). Needs a CUDA GPU, torch and\n"
        "transformers.",
        epilog=f"""workloads (requests x prompt tokens in / generated tokens out, as `llmq bench`):
{table}

modes:
  static     model.generate() on fixed batches of --batch requests (transformers' plain path)
  compiled   the same with a static KV cache, which transformers compiles (torch.compile, CUDA graphs);
             each batch size is compiled in an untimed warm-up
  cb         transformers' continuous batching, model.generate_batch() (where the installed version has
             it), attention 'paged|sdpa'

examples:
  transformers_peer.py --random-weights qwen3-14b --workload chat --num-prompts 256
  transformers_peer.py --random-weights qwen3-14b --workload single,decode --mode compiled
  transformers_peer.py --model /models/Qwen3-8B --workload summarize --num-prompts 64 --batch 32

A full-size workload takes long in the static modes (chat: 1000 requests in batches of 128), so the
numbers in docs/PERFORMANCE.md use --num-prompts (whole batches: in static mode the rate then changes
little with the count). Exit status: 0 every request generated its length, 1 a run failed, 2 the command
line is wrong.""")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("-r", "--random-weights", metavar="SHAPE", choices=sorted(SHAPES),
                     help="random weights of a named shape: " + " | ".join(SHAPES) + " (no files; "
                     + ", ".join(s for s in SHAPES if is_moe(s)) + " is Qwen3-MoE)")
    src.add_argument("-m", "--model", metavar="DIR", help="a Hugging Face checkpoint folder instead")
    ap.add_argument("-w", "--workload", metavar="W[,W...]",
                    help="one or more of " + ", ".join(WORKLOADS) + " (comma-separated; one JSON line each)")
    ap.add_argument("-n", "--num-prompts", type=int, metavar="N", help="requests (default: the workload's)")
    ap.add_argument("--input-len", type=int, metavar="N",
                    help="prompt tokens per request (default: the workload's)")
    ap.add_argument("--output-len", type=int, metavar="N",
                    help="generated tokens per request (default: the workload's)")
    ap.add_argument("--mode", choices=MODES, default="static", help="static (default) | compiled | cb, below")
    ap.add_argument("--batch", type=int, default=128, metavar="N",
                    help="requests per generate() call in static and compiled mode (default 128)")
    ap.add_argument("--max-batch-tokens", type=int, default=8192, metavar="N",
                    help="tokens per step in cb mode (default 8192)")
    ap.add_argument("--dtype", choices=DTYPES, default="bf16",
                    help="weights, activations and KV cache: bf16 (default) | fp16")
    ap.add_argument("--attn", metavar="IMPL",
                    help="transformers' attn_implementation (default sdpa; paged|sdpa in cb mode)")
    ap.add_argument("--device", type=int, default=0, metavar="N", help="CUDA device index (default 0)")
    ap.add_argument("--seed", type=int, default=0, metavar="N", help="prompt and weight seed (default 0)")
    ap.add_argument("--describe", action="store_true",
                    help="print the workloads and model shapes as one JSON object and exit (no GPU needed)")
    a = ap.parse_args(argv)
    if a.describe:
        return a
    if not a.random_weights and not a.model:
        ap.error("give one of --random-weights SHAPE or --model DIR")
    if not a.workload:
        ap.error("--workload is required (" + ", ".join(WORKLOADS) + ")")
    a.workloads = a.workload.split(",")
    for w in a.workloads:
        if w not in WORKLOADS:
            ap.error(f"--workload: '{w}' (expected {', '.join(WORKLOADS)})")
    for name in ("num_prompts", "input_len", "output_len", "batch", "max_batch_tokens"):
        v = getattr(a, name)
        if v is not None and v < 1:
            ap.error(f"--{name.replace('_', '-')}: {v} is not an integer >= 1")
    if a.attn is None:
        a.attn = "paged|sdpa" if a.mode == "cb" else "sdpa"
    return a


def import_torch():
    """torch and transformers, imported for a run; exits 1 with what to install when they are missing."""
    try:
        import torch
        import transformers
    except ImportError as e:
        sys.exit(f"transformers_peer.py: a run needs torch and transformers ({e}); "
                 "pip install torch transformers")
    return torch, transformers


def torch_dtype(torch, name):
    """The torch dtype of a --dtype name."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def qwen3_config(transformers, shape, attn):
    """A Qwen3Config (a Qwen3MoeConfig for a MoE shape, router logits not returned) of a named shape,
    checked field by field after construction (the RoPE base moved from rope_theta to rope_parameters in
    transformers 5, Qwen3MoeConfig has no head_dim field but keeps it as an attribute, and a silently
    dropped field would change the model)."""
    import inspect
    Config = transformers.Qwen3MoeConfig if is_moe(shape) else transformers.Qwen3Config
    kw = dict(COMMON, **SHAPES[shape])
    if is_moe(shape):
        kw["output_router_logits"] = False
    theta = kw.pop("rope_theta")
    if "rope_parameters" in inspect.signature(Config).parameters:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    else:
        kw["rope_theta"] = theta
    cfg = Config(**kw)
    cfg._attn_implementation = attn
    rope = getattr(cfg, "rope_parameters", None)
    got = dict((k, getattr(cfg, k)) for k in kw if k not in ("rope_parameters", "rope_theta"))
    got_theta = rope["rope_theta"] if rope else cfg.rope_theta
    want = dict(kw)
    want.pop("rope_parameters", None)
    want.pop("rope_theta", None)
    if got != want or float(got_theta) != theta:
        raise RuntimeError(f"{Config.__name__} did not keep the shape: got {got}, rope_theta {got_theta}; "
                           f"want {want}, rope_theta {theta}")
    return cfg


def random_model(torch, transformers, shape, dtype, attn, device, seed):
    """A Qwen3ForCausalLM (Qwen3MoeForCausalLM for a MoE shape) of a named shape, made on the GPU in dtype,
    with llmq's weight rule: norm weights 1, every other weight (MoE routers and experts included) uniform
    with standard deviation WEIGHT_STD. Checks that its parameter count is the shape's (shape_params), so
    the peer computes what llmq computes."""
    cfg = qwen3_config(transformers, shape, attn)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = (transformers.Qwen3MoeForCausalLM if is_moe(shape) else transformers.Qwen3ForCausalLM)(cfg)
    finally:
        torch.set_default_dtype(prev)
    amp = WEIGHT_STD * math.sqrt(3.0)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied lm_head is the embedding: listed once
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.uniform_(-amp, amp, generator=gen)
    n = sum(p.numel() for p in model.parameters())
    if n != shape_params(shape):
        raise RuntimeError(f"{shape}: transformers built {n} parameters, llmq's shape has "
                           f"{shape_params(shape)}")
    return model.eval()


def load_checkpoint(torch, transformers, path, dtype, attn, device):
    """A Hugging Face checkpoint folder, loaded in dtype onto the GPU (transformers 4.56 renamed
    torch_dtype to dtype; older versions would read dtype as a config field and load fp32)."""
    ver = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
    key = "dtype" if ver >= (4, 56) else "torch_dtype"
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn, **{key: dtype})
    return model.to(device).eval()


def make_prompts(n, length, vocab, seed):
    """n prompts of `length` random token ids from [0, min(vocab, PROMPT_ID_RANGE)), seeded."""
    rng = random.Random(seed)
    hi = min(vocab, PROMPT_ID_RANGE)
    return [[rng.randrange(hi) for _ in range(length)] for _ in range(n)]


def run_batches(torch, model, prompts, out_len, batch, device, **generate_kw):
    """model.generate() over fixed batches of prompts; returns (tokens generated, requests that did not
    generate exactly out_len)."""
    done = failed = 0
    for i in range(0, len(prompts), batch):
        x = torch.tensor(prompts[i:i + batch], device=device)
        with torch.no_grad():
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=out_len,
                               min_new_tokens=out_len, do_sample=False, pad_token_id=COMMON["pad_token_id"],
                               **generate_kw)
        new = y.shape[1] - x.shape[1]
        done += new * x.shape[0]
        failed += x.shape[0] if new != out_len else 0
    return done, failed


def run_cb(torch, model, prompts, out_len, max_batch_tokens):
    """transformers' continuous batching (generate_batch); returns (tokens generated, requests that did
    not generate exactly out_len)."""
    from transformers import GenerationConfig
    if not hasattr(model, "generate_batch"):
        raise RuntimeError("this transformers has no continuous batching (model.generate_batch)")
    gc = GenerationConfig(max_new_tokens=out_len, min_new_tokens=out_len, do_sample=False, eos_token_id=-1,
                          pad_token_id=COMMON["pad_token_id"], max_batch_tokens=max_batch_tokens,
                          num_blocks=None, block_size=128)
    with torch.no_grad():
        res = model.generate_batch(inputs=prompts, generation_config=gc)
    lens = [len(r.generated_tokens) for r in res.values()]
    return sum(lens), len(prompts) - sum(1 for n in lens if n == out_len)


def run(torch, model, mode, prompts, out_len, a, device):
    """One timed pass of prompts in a mode; returns (tokens generated, failed requests)."""
    if mode == "cb":
        return run_cb(torch, model, prompts, out_len, a.max_batch_tokens)
    kw = {"cache_implementation": "static"} if mode == "compiled" else {}
    return run_batches(torch, model, prompts, out_len, a.batch, device, **kw)


def warm_up(torch, model, mode, n, in_len, out_len, vocab, a, device):
    """Untimed runs on prompts of their own: in compiled mode one batch of every size the timed run
    will use, at the full output length (so compilation and the static cache's shapes are done);
    otherwise one batch of 8 tokens."""
    if mode == "compiled":
        sizes = sorted({min(a.batch, n - i) for i in range(0, n, a.batch)})
        for s in sizes:
            run(torch, model, mode, make_prompts(s, in_len, vocab, a.seed + 1), out_len, a, device)
    else:
        run(torch, model, mode, make_prompts(min(n, a.batch), in_len, vocab, a.seed + 1), min(out_len, 8), a,
            device)


def measure(torch, transformers, model, name, workload, a, device):
    """Warms up, then times one workload; returns its JSON line as a dict."""
    n, in_len, out_len = WORKLOADS[workload]
    n, in_len, out_len = a.num_prompts or n, a.input_len or in_len, a.output_len or out_len
    vocab = model.config.vocab_size
    warm_up(torch, model, a.mode, n, in_len, out_len, vocab, a, device)
    prompts = make_prompts(n, in_len, vocab, a.seed)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    out, failed = run(torch, model, a.mode, prompts, out_len, a, device)
    torch.cuda.synchronize(device)
    secs = time.perf_counter() - t0
    return {
        "engine": "transformers",
        "mode": a.mode,
        "model": name,
        "workload": workload,
        "requests": n,
        "input_len": in_len,
        "output_len": out_len,
        "seconds": round(secs, 3),
        "requests_per_s": round(n / secs, 3),
        "output_tokens_per_s": round(out / secs, 1),
        "total_tokens_per_s": round((out + n * in_len) / secs, 1),
        "weight_dtype": a.dtype,
        "kv_cache_dtype": a.dtype,
        "batch": None if a.mode == "cb" else a.batch,
        "attn_implementation": a.attn,
        "peak_torch_allocated_gb": round(torch.cuda.max_memory_allocated(device) / 1e9, 1),
        "gpu": torch.cuda.get_device_name(device),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "failed": failed,
    }


def main(argv):
    """Parses the command line, loads the model once, prints one JSON line per workload; the exit status."""
    a = parse_args(argv)
    if a.describe:
        print(json.dumps(describe()))
        return 0
    torch, transformers = import_torch()
    if not torch.cuda.is_available():
        print("transformers_peer.py: no CUDA device (torch.cuda.is_available() is false)", file=sys.stderr)
        return 1
    device = torch.device("cuda", a.device)
    dtype = torch_dtype(torch, a.dtype)
    torch.manual_seed(a.seed)
    if a.random_weights:
        model = random_model(torch, transformers, a.random_weights, dtype, a.attn, device, a.seed)
        name = a.random_weights
    else:
        model = load_checkpoint(torch, transformers, a.model, dtype, a.attn, device)
        name = os.path.basename(os.path.normpath(a.model))
    rc = 0
    for w in a.workloads:
        line = measure(torch, transformers, model, name, w, a, device)
        print(json.dumps(line), flush=True)
        rc = 1 if line["failed"] else rc
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
