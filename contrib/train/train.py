#!/usr/bin/env python3
"""Trains llmq's tiny summarizer: a byte-level BPE tokenizer and a small Qwen3 chat model, from the
pairs contrib/train/make_data.py writes. Needs PyTorch, transformers and tokenizers (a CUDA GPU for
the real run; --smoke runs a few steps anywhere).

    contrib/train/train.py --data DATA --out MODEL_DIR [--minutes 5] [--seed 1] [--smoke]

Writes MODEL_DIR in Hugging Face layout (config.json, model.safetensors in bf16, tokenizer.json,
tokenizer_config.json with the chat template, generation_config.json) and MODEL_DIR/train_log.jsonl
(the loss curve: one line per logged step, then the validation loss and the scores of a greedy
decode of the first --eval-pairs test pairs: ROUGE-L F1 of the model and of the lead baseline, the
document's first words cut to the reference summary's length).

The chat format is Qwen3's (<|im_start|>role\\n...<|im_end|>\\n); the user message is
PROMPT.format(document=...), the assistant's the summary. The loss counts the assistant's tokens
and its <|im_end|> only. Everything random is seeded; a run on another GPU or library version may
still differ in its last bits.
"""
import argparse
import json
import math
import os
import random
import time

PROMPT = "Summarize the following package description in one line.\n\n{document}"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2/Qwen3's pre-tokenizer split (the tokenizer.json llmq already reads for Qwen3)
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def read_pairs(path, limit=None):
    rows = []
    with open(path) as f:
        for line in f:
            rows.append(json.loads(line))
            if limit and len(rows) >= limit:
                break
    return rows


def train_tokenizer(texts, vocab_size, out):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.save(os.path.join(out, "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    config = {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "added_tokens_decoder": {str(i): {"content": s, "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False, "special": True}
                                 for s, i in ids.items()},
        "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
        "errors": "replace", "model_max_length": 1024, "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer"}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    return tok, ids


def encode_pair(tok, ids, row, max_doc_tokens):
    """Prompt ids (through the assistant header) and the target ids (summary + <|im_end|>)."""
    doc_ids = tok.encode(row["document"]).ids[:max_doc_tokens]
    doc = tok.decode(doc_ids)
    user = PROMPT.format(document=doc)
    prompt = "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n"
    p = tok.encode(prompt).ids
    t = tok.encode(row["summary"]).ids + [ids["<|im_end|>"]]
    return p, t


def lcs(a, b):
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l(hyp, ref):
    """ROUGE-L F1 over lower-cased whitespace words (as tests/unit's scorer computes it)."""
    h, r = hyp.lower().split(), ref.lower().split()
    if not h or not r:
        return 0.0
    n = lcs(h, r)
    if n == 0:
        return 0.0
    p, rc = n / len(h), n / len(r)
    return 2 * p * rc / (p + rc)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=5.0, help="training time budget")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--max-doc-tokens", type=int, default=320)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--eval-pairs", type=int, default=500)
    ap.add_argument("--smoke", action="store_true", help="a few steps on a few pairs (checks the script)")
    args = ap.parse_args()

    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "train_log.jsonl"), "w")

    def note(**kv):
        log.write(json.dumps(kv) + "\n")
        log.flush()
        print(json.dumps(kv), flush=True)

    limit = 2000 if args.smoke else None
    train = read_pairs(os.path.join(args.data, "train.jsonl"), limit)
    valid = read_pairs(os.path.join(args.data, "valid.jsonl"), 200 if args.smoke else 2000)
    test = read_pairs(os.path.join(args.data, "test.jsonl"), 20 if args.smoke else args.eval_pairs)

    t0 = time.time()
    texts = [PROMPT.format(document=r["document"]) for r in train] + [r["summary"] for r in train]
    tok, ids = train_tokenizer(texts, args.vocab, args.out)
    vocab = tok.get_vocab_size()
    note(event="tokenizer", vocab=vocab, seconds=round(time.time() - t0, 1))

    enc_train = [encode_pair(tok, ids, r, args.max_doc_tokens) for r in train]
    enc_valid = [encode_pair(tok, ids, r, args.max_doc_tokens) for r in valid]
    max_len = max(len(p) + len(t) for p, t in enc_train + enc_valid)

    cfg = Qwen3Config(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
        max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        torch_dtype="bfloat16", attention_dropout=0.0)
    model = Qwen3ForCausalLM(cfg).to(dev)
    params = sum(p.numel() for p in model.parameters())
    note(event="model", parameters=params, max_len=max_len, train_pairs=len(train),
         valid_pairs=len(valid), test_pairs=len(test), device=dev,
         gpu=torch.cuda.get_device_name() if dev == "cuda" else None)

    def batches(data, bs, shuffle):
        order = list(range(len(data)))
        if shuffle:
            random.shuffle(order)
        for i in range(0, len(order), bs):
            chunk = [data[j] for j in order[i:i + bs]]
            n = max(len(p) + len(t) for p, t in chunk)
            x = torch.full((len(chunk), n), ids["<|endoftext|>"], dtype=torch.long)
            y = torch.full((len(chunk), n), -100, dtype=torch.long)
            for k, (p, t) in enumerate(chunk):
                seq = p + t
                x[k, :len(seq)] = torch.tensor(seq)
                y[k, len(p):len(seq)] = torch.tensor(t)
            yield x.to(dev), y.to(dev)

    def loss_of(x, y):
        with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            logits = model(input_ids=x).logits[:, :-1].float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                 y[:, 1:].reshape(-1), ignore_index=-100)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    budget = 20 if args.smoke else args.minutes * 60
    steps_per_epoch = math.ceil(len(enc_train) / args.batch)
    # the schedule needs a step count: estimate it from the first 20 steps' speed
    total_steps, step, epoch, t_train = None, 0, 0, time.time()
    warmup = 100
    done = False
    while not done:
        for x, y in batches(enc_train, args.batch, True):
            if total_steps is None and step == 20:
                rate = step / (time.time() - t_train)
                total_steps = max(40, int(rate * budget))
                note(event="schedule", steps=total_steps, steps_per_s=round(rate, 2))
            horizon = total_steps or 10 ** 9
            lr = args.lr * min(1.0, (step + 1) / warmup) * (
                0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / horizon))))
            for g in opt.param_groups:
                g["lr"] = lr
            loss = loss_of(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            if step % 50 == 0 or step == 1:
                note(event="train", step=step, epoch=round(step / steps_per_epoch, 2),
                     loss=round(loss.item(), 4), lr=round(lr, 6),
                     seconds=round(time.time() - t_train, 1))
            if (total_steps and step >= total_steps) or (args.smoke and step >= 30):
                done = True
                break
        epoch += 1
    train_seconds = time.time() - t_train

    model.eval()
    with torch.no_grad():
        tot, n = 0.0, 0
        for x, y in batches(enc_valid, args.batch, False):
            k = (y[:, 1:] != -100).sum().item()
            tot += loss_of(x, y).item() * k
            n += k
    note(event="valid", loss=round(tot / n, 4), steps=step, train_seconds=round(train_seconds, 1))

    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"], do_sample=False, max_new_tokens=32)
    model.save_pretrained(args.out, safe_serialization=True)

    scores, lead, samples = [], [], []
    with torch.no_grad():
        for r in test:
            p, _ = encode_pair(tok, ids, r, args.max_doc_tokens)
            out = model.generate(torch.tensor([p], device=dev), max_new_tokens=32, do_sample=False)
            hyp = tok.decode(out[0, len(p):].tolist(), skip_special_tokens=True).strip()
            scores.append(rouge_l(hyp, r["summary"]))
            lead.append(rouge_l(" ".join(r["document"].split()[:len(r["summary"].split())]),
                                r["summary"]))
            if len(samples) < 10:
                samples.append({"id": r["id"], "reference": r["summary"], "model": hyp})
    note(event="test", pairs=len(test), rouge_l=round(sum(scores) / len(scores), 4),
         lead_rouge_l=round(sum(lead) / len(lead), 4), samples=samples)
    log.close()


if __name__ == "__main__":
    main()
