#!/usr/bin/env python3
"""Jobs and checks of tests/cli/test_structured_output.sh.

  structured_check.py jobs SCHEMAS OUT.jsonl   writes the jobs: every schema of SCHEMAS (a JSON object
                                               name -> schema) at several seeds and temperatures, as
                                               llmq jobs and as OpenAI Batch lines, plus json_object,
                                               regex and choice jobs
  structured_check.py check SCHEMAS JOBS RESULTS   checks every result against its job with independent
                                               references: python3-jsonschema (Draft 2020-12, formats
                                               asserted) for schemas, Python's re for regexes
Prints one line per failed check and a summary; exits 1 on any failure."""
import json
import re
import sys

import jsonschema

RUNS = ((1, 0.0), (2, 1.0))  # (seed, temperature) of each schema's llmq jobs; its OpenAI line: seed 7, 1.5
MAX_TOKENS = 400
REGEXES = [r"[A-Z][a-z]{2,6} [0-9]{3}", r"(yes|no|maybe)!?", r"\d{4}-\d{2}-\d{2}", r"[a-f0-9]{8}(-[a-f0-9]{4}){1,2}",
           r"\(\d{3}\) \d{3}-\d{4}"]
CHOICES = [["red", "green", "blue"], ["Paris", "London", "Rome", "Tōkyō"]]
# a raw prompt in Qwen3's chat format with thinking off (the empty think block): the grammar starts at
# the first token (a prompt without it would let the first token open a think block, which a random
# model sometimes takes)
PROMPT = ("<|im_start|>user\nDescribe the item as requested.<|im_end|>\n<|im_start|>assistant\n"
          "<think>\n\n</think>\n\n")


def make_jobs(schemas, out):
    lines = []
    for name, schema in schemas.items():
        for seed, t in RUNS:
            rf = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
            lines.append({"id": f"{name}-s{seed}-t{t}", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "seed": seed,
                          "temperature": t, "response_format": rf})
        lines.append({"custom_id": f"{name}-openai", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "m", "messages": [{"role": "user", "content": "Describe the item."}],
                               "chat_template_kwargs": {"enable_thinking": False},
                               "max_tokens": MAX_TOKENS, "seed": 7, "temperature": 1.5,
                               "response_format": {"type": "json_schema",
                                                   "json_schema": {"name": name, "schema": schema}}}})
    # any object: its strings are long under a random model; a small max_tokens shows the cut
    lines.append({"id": "object", "prompt": PROMPT, "max_tokens": 48, "seed": 1,
                  "response_format": {"type": "json_object"}})
    for i, rx in enumerate(REGEXES):
        lines.append({"id": f"regex{i}", "prompt": PROMPT, "max_tokens": 100, "seed": i, "temperature": 0.5 * i,
                      "regex": rx})
    for i, ch in enumerate(CHOICES):
        lines.append({"id": f"choice{i}", "prompt": PROMPT, "max_tokens": 50, "seed": i, "temperature": 1.0,
                      "choice": ch})
    with open(out, "w", encoding="utf-8") as f:
        for l in lines:
            f.write(json.dumps(l, ensure_ascii=False) + "\n")


def check(schemas, jobs_path, results_path):
    jobs = {}
    for l in open(jobs_path, encoding="utf-8"):
        j = json.loads(l)
        jobs[j.get("custom_id") or j["id"]] = j
    results = {}
    for l in open(results_path, encoding="utf-8"):
        r = json.loads(l)
        results[r.get("custom_id") or r["id"]] = r
    bad = []
    n_json = n_stopped = n_cut = 0
    fc = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for jid, j in jobs.items():
        r = results.get(jid)
        if r is None:
            bad.append(f"{jid}: no result")
            continue
        if "body" in j:  # OpenAI Batch line
            body = r["response"]["body"]
            text = body["choices"][0]["message"]["content"]
            finish = body["choices"][0]["finish_reason"]
            rf = j["body"]["response_format"]
        else:
            if r.get("error"):
                bad.append(f"{jid}: failed: {r['error']}")
                continue
            text, finish, rf = r["text"], r["finish_reason"], j.get("response_format")
        if rf:
            n_json += 1
            schema = schemas[rf["json_schema"]["name"]] if rf["type"] == "json_schema" else {"type": "object"}
            if finish == "length":
                n_cut += 1
                if "body" not in j and (r.get("json") is not None or r.get("json_incomplete") is not True):
                    bad.append(f"{jid}: cut by max_tokens but json={r.get('json')!r} "
                               f"json_incomplete={r.get('json_incomplete')!r}")
                continue
            n_stopped += 1
            try:
                value = json.loads(text)
            except ValueError as e:
                bad.append(f"{jid}: finished ({finish}) with text that does not parse ({e}): {text!r}")
                continue
            errs = list(jsonschema.Draft202012Validator(schema, format_checker=fc).iter_errors(value))
            if errs:
                bad.append(f"{jid}: {text!r} does not validate: {errs[0].message}")
            if "body" not in j and r.get("json") != value:
                bad.append(f"{jid}: result json {r.get('json')!r} is not the parsed text")
        elif "regex" in j:
            if finish == "length":
                bad.append(f"{jid}: a regex this small should end within max_tokens: {text!r}")
            elif not re.fullmatch(j["regex"], text):
                bad.append(f"{jid}: {text!r} does not match {j['regex']!r}")
        elif "choice" in j:
            if text not in j["choice"]:
                bad.append(f"{jid}: {text!r} is not one of {j['choice']}")
    for b in bad:
        print("FAIL", b)
    print(f"{len(jobs)} jobs, {n_json} under a JSON constraint: {n_stopped} ended by themselves, {n_cut} cut by "
          f"max_tokens; {len(bad)} failures")
    if n_json and n_stopped < n_json // 2:
        print("FAIL fewer than half of the JSON jobs ended by themselves: the check would prove little")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    schemas = json.load(open(sys.argv[2], encoding="utf-8"))
    if sys.argv[1] == "jobs":
        make_jobs(schemas, sys.argv[3])
        sys.exit(0)
    sys.exit(check(schemas, sys.argv[3], sys.argv[4]))
