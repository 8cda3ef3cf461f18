#!/usr/bin/env bash
# `llmq make-tiny-model`: the same options give byte-identical folders (whatever --threads), other seeds other weights;
# the written files say what was asked; bad flags and values exit 2 with a message naming them.
# The parts with real tokenizers (Qwen3, Llama-3, Llama-3.1, DeepSeek-V3, Gemma-3) run when
# tests/assets/fetch.sh got them (otherwise they say why).
set -u
fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
bad() { echo "FAIL $*"; fail=1; }
check() { # check NAME WANT_RC CMD... ; stdout+stderr in $out
  local name=$1 want=$2; shift 2
  out=$("$@" 2>&1); local rc=$?
  if [ "$rc" -ne "$want" ]; then bad "$name: exit $rc, want $want; output: $out"; else echo "ok $name"; fi
}
sums() { (cd "$1" && sha256sum $(ls | sort)); }
want_msg() { echo "$out" | grep -qF -- "$1" || bad "$2: output lacks '$1': $out"; }

check "--help" 0 "$LLMQ_BIN" make-tiny-model --help
want_msg "Usage: llmq make-tiny-model DIR" "--help"

# determinism: two runs of the same options, several variants; the second with one drawing thread
# (the first with one a CPU), so the files do not depend on the threads either
variants=("" "--dtype fp8 --shards 3 --arch qwen2 --no-tie --seed 9" "--arch llama --dtype f16 --hidden 48 --heads 6 --kv-heads 2 --head-dim 12"
          "--dtype f32 --layers 3 --vocab 300 --rope-theta 1e6 --max-position 128")
i=0
for v in "${variants[@]}"; do
  i=$((i + 1))
  check "make variant $i ($v) a" 0 "$LLMQ_BIN" make-tiny-model "$tmp/a$i" $v
  check "make variant $i b" 0 "$LLMQ_BIN" make-tiny-model "$tmp/b$i" $v --threads 1
  [ "$(sums "$tmp/a$i")" = "$(sums "$tmp/b$i")" ] || bad "variant $i: two runs differ: $(diff <(sums "$tmp/a$i") <(sums "$tmp/b$i"))"
done
ls "$tmp/a1" | tr '\n' ' ' | grep -qx "config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json " \
  || bad "default files: $(ls "$tmp/a1")"
[ "$(ls "$tmp/a2" | grep -c '^model-0000[123]-of-00003.safetensors$')" = 3 ] && [ -f "$tmp/a2/model.safetensors.index.json" ] \
  || bad "--shards 3 files: $(ls "$tmp/a2")"
check "seed 1" 0 "$LLMQ_BIN" make-tiny-model "$tmp/s1" --seed 1
cmp -s "$tmp/a1/model.safetensors" "$tmp/s1/model.safetensors" && bad "--seed 1 gives the same weights as --seed 0"
cmp -s "$tmp/a1/config.json" "$tmp/s1/config.json" || bad "--seed changes config.json"

# what the files say
j() { jq -c "$2" "$1"; }
[ "$(j "$tmp/a1/config.json" '[.architectures[0], .hidden_size, .intermediate_size, .num_hidden_layers, .num_attention_heads, .num_key_value_heads, .head_dim, .vocab_size, .max_position_embeddings, .tie_word_embeddings, .torch_dtype]')" \
  = '["Qwen3ForCausalLM",64,128,2,4,2,16,512,4096,true,"bfloat16"]' ] || bad "default config: $(cat "$tmp/a1/config.json")"
[ "$(j "$tmp/a1/generation_config.json" .eos_token_id)" = "[274,272]" ] || bad "eos: $(cat "$tmp/a1/generation_config.json")"
[ "$(j "$tmp/a1/tokenizer.json" '[.model.vocab["!"], .model.vocab["Ġthe"], (.added_tokens | map(.content + "=" + (.id | tostring)))]')" \
  = '[0,258,["<|endoftext|>=272","<|im_start|>=273","<|im_end|>=274"]]' ] || bad "minimal tokenizer.json"
[ "$(j "$tmp/a1/tokenizer_config.json" .eos_token)" = '"<|im_end|>"' ] || bad "tokenizer_config eos_token"
[ "$(j "$tmp/a2/config.json" '[.architectures[0], .tie_word_embeddings, .quantization_config.quant_method, .quantization_config.weight_block_size]')" \
  = '["Qwen2ForCausalLM",false,"fp8",[128,128]]' ] || bad "fp8 qwen2 config: $(cat "$tmp/a2/config.json")"
[ "$(j "$tmp/a2/model.safetensors.index.json" '.weight_map | length')" -gt 20 ] || bad "index weight_map"
[ "$(j "$tmp/a3/config.json" '[.architectures[0], .head_dim, .torch_dtype]')" = '["LlamaForCausalLM",12,"float16"]' ] || bad "llama config"
[ "$(j "$tmp/a4/config.json" '[.rope_theta == 1e6, .max_position_embeddings, .num_hidden_layers, .vocab_size]')" = '[true,128,3,300]' ] \
  || bad "rope/max-position config: $(cat "$tmp/a4/config.json")"

# a folder rewritten with one file loses the old shards and index
check "rewrite unsharded" 0 "$LLMQ_BIN" make-tiny-model "$tmp/a2"
[ -f "$tmp/a2/model.safetensors" ] && ! ls "$tmp/a2" | grep -q "of-00003\|index" || bad "stale shards kept: $(ls "$tmp/a2")"

# bad flags and values: exit 2, naming the problem
check "unknown flag" 2 "$LLMQ_BIN" make-tiny-model "$tmp/x" --frob; want_msg "--frob" "unknown flag"
check "no DIR" 2 "$LLMQ_BIN" make-tiny-model; want_msg "missing the output folder" "no DIR"
check "two DIRs" 2 "$LLMQ_BIN" make-tiny-model "$tmp/x" "$tmp/y"
check "heads/kv-heads" 2 "$LLMQ_BIN" make-tiny-model "$tmp/x" --heads 4 --kv-heads 3; want_msg "--heads 4 is not a multiple of --kv-heads 3" "heads"
check "hidden/heads" 2 "$LLMQ_BIN" make-tiny-model "$tmp/x" --hidden 66; want_msg "--hidden 66 is not a multiple of --heads 4" "hidden"
check "bad int" 2 "$LLMQ_BIN" make-tiny-model "$tmp/x" --layers two; want_msg "--layers: 'two' is not an integer" "bad int"
check "zero layers" 2 "$LLMQ_BIN" make-tiny-model "$tmp/x" --layers 0; want_msg "--layers 0 is out of range" "zero layers"
check "zero threads" 2 "$LLMQ_BIN" make-tiny-model "$tmp/x" --threads 0; want_msg "--threads 0 is out of range" "zero threads"
check "bad dtype" 2 "$LLMQ_BIN" make-tiny-model "$tmp/x" --dtype int4; want_msg "--dtype: 'int4'" "bad dtype"
check "bad arch" 2 "$LLMQ_BIN" make-tiny-model "$tmp/x" --arch gpt2; want_msg "--arch: 'gpt2'" "bad arch"
check "bad theta" 2 "$LLMQ_BIN" make-tiny-model "$tmp/x" --rope-theta abc; want_msg "--rope-theta" "bad theta"
check "negative seed" 2 "$LLMQ_BIN" make-tiny-model "$tmp/x" --seed -1
check "small vocab" 2 "$LLMQ_BIN" make-tiny-model "$tmp/x" --vocab 100; want_msg "--vocab 100 is smaller" "small vocab"
check "too many shards" 2 "$LLMQ_BIN" make-tiny-model "$tmp/x" --shards 1000; want_msg "--shards 1000" "shards"
check "missing tokenizer" 2 "$LLMQ_BIN" make-tiny-model "$tmp/x" --tokenizer "$tmp/nowhere"; want_msg "--tokenizer" "tokenizer"
[ -e "$tmp/x" ] && bad "a refused command created $tmp/x"
touch "$tmp/file"
check "DIR is a file" 1 "$LLMQ_BIN" make-tiny-model "$tmp/file/sub"

# the real Qwen3 tokenizer
tok=${LLMQ_ASSETS:-}/qwen3-tokenizer
if [ -f "$tok/tokenizer.json" ]; then
  check "qwen3 tokenizer" 0 "$LLMQ_BIN" make-tiny-model "$tmp/q" --tokenizer "$tok"
  cmp -s "$tok/tokenizer.json" "$tmp/q/tokenizer.json" && cmp -s "$tok/tokenizer_config.json" "$tmp/q/tokenizer_config.json" \
    || bad "tokenizer files not copied as they are"
  [ "$(j "$tmp/q/config.json" .vocab_size)" = 151936 ] || bad "vocab with the Qwen3 tokenizer: $(j "$tmp/q/config.json" .vocab_size)"
  [ "$(j "$tmp/q/generation_config.json" .eos_token_id)" = "[151645,151643]" ] || bad "Qwen3 eos: $(cat "$tmp/q/generation_config.json")"
  check "qwen3 tokenizer, small vocab" 2 "$LLMQ_BIN" make-tiny-model "$tmp/q2" --tokenizer "$tok" --vocab 151000
  want_msg "smaller than the tokenizer's 151669 tokens" "qwen3 small vocab"
else
  echo "skip the Qwen3-tokenizer part: $(cat "${LLMQ_ASSETS:-/nonexistent}/fetch-failed" 2>/dev/null || echo "no $tok")"
fi

# the other families' tokenizers: the architecture and vocab size follow the tokenizer (Llama for
# Llama-3 and DeepSeek-V3), bos/eos ids come from its tokenizer_config.json, and the folder loads
# and runs; Gemma-3's SentencePiece-style tokenizer is refused before anything is written
family() { # family NAME ARCH VOCAB BOS EOS_LIST
  local name=$1 tok=${LLMQ_ASSETS:-}/$1-tokenizer
  if [ ! -f "$tok/tokenizer.json" ]; then
    echo "skip the $name-tokenizer part: $(cat "${LLMQ_ASSETS:-/nonexistent}/fetch-failed" 2>/dev/null || echo "no $tok")"
    return
  fi
  check "$name tokenizer" 0 "$LLMQ_BIN" make-tiny-model "$tmp/$name" --tokenizer "$tok"
  cmp -s "$tok/tokenizer.json" "$tmp/$name/tokenizer.json" || bad "$name: tokenizer.json not copied as it is"
  [ "$(j "$tmp/$name/config.json" '[.architectures[0], .vocab_size, .bos_token_id, .eos_token_id]')" = "[\"$2\",$3,$4,$(echo "$5" | jq '.[0]')]" ] \
    || bad "$name config: $(j "$tmp/$name/config.json" '[.architectures[0], .vocab_size, .bos_token_id, .eos_token_id]')"
  [ "$(j "$tmp/$name/generation_config.json" .eos_token_id)" = "$5" ] || bad "$name eos: $(cat "$tmp/$name/generation_config.json")"
  check "$name tokenizer, --arch qwen2 wins" 0 "$LLMQ_BIN" make-tiny-model "$tmp/$name-q2" --tokenizer "$tok" --arch qwen2 --layers 1
  [ "$(j "$tmp/$name-q2/config.json" .architectures[0])" = '"Qwen2ForCausalLM"' ] || bad "$name: --arch qwen2 not kept"
  check "$name run" 0 "$LLMQ_BIN" run --model "$tmp/$name" --backend cpu --input <(echo '{"id":"a","prompt":"Hello world","max_tokens":2}') --output "$tmp/$name.out"
  [ "$(jq -c '[.status, .usage.completion_tokens]' "$tmp/$name.out")" = '["completed",2]' ] || bad "$name run: $(cat "$tmp/$name.out")"
}
family llama3 LlamaForCausalLM 128256 128000 '[128001,128009]'
family llama3_1 LlamaForCausalLM 128256 128000 '[128009,128001]'
family deepseek_v3 LlamaForCausalLM 128896 0 '[1]'
tok=${LLMQ_ASSETS:-}/gemma3-tokenizer
if [ -f "$tok/tokenizer.json" ]; then
  check "gemma3 tokenizer refused" 2 "$LLMQ_BIN" make-tiny-model "$tmp/g" --tokenizer "$tok"
  want_msg "not SentencePiece-style BPE with byte fallback (Gemma" "gemma3 refused"
  [ -e "$tmp/g" ] && bad "a refused gemma3 tokenizer created $tmp/g"
else
  echo "skip the gemma3-tokenizer part: $(cat "${LLMQ_ASSETS:-/nonexistent}/fetch-failed" 2>/dev/null || echo "no $tok")"
fi

[ $fail -eq 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $fail
