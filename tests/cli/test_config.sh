#!/usr/bin/env bash
# `llmq config`: effective values with their origins, the precedence defaults < file < environment
# < flags, --keys, --check, --get, secrets, and the example file conf/llmq.yaml.
set -u
fail=0
pass=0
conf="$LLMQ_SOURCE_DIR/conf/llmq.yaml"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# keep the caller's LLMQ_<SECTION>_* variables out of the way
for v in $(env | sed -n 's/^\(LLMQ_[A-Z]*_[A-Z0-9_]*\)=.*/\1/p'); do
  case $v in LLMQ_BIN|LLMQ_SOURCE_DIR|LLMQ_BUILD_DIR|LLMQ_ASSETS) ;; *) unset "$v" ;; esac
done
unset LLMQ_CONFIG

ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
check() { # check NAME WANT_RC CMD... ; stdout+stderr in $out
  local name=$1 want=$2; shift 2
  out=$("$@" 2>&1); local rc=$?
  if [ "$rc" -ne "$want" ]; then bad "$name: exit $rc, want $want; output: $out"; else ok "$name"; fi
}
has() { # has NAME TEXT: $out contains TEXT
  if printf '%s' "$out" | grep -qF -- "$2"; then ok "$1"; else bad "$1: no '$2' in: $out"; fi
}

# ---- the command line
check "--help" 0 "$LLMQ_BIN" config --help
has "--help usage" "Usage: llmq config"
has "--help precedence" "defaults < the file (-c) < environment LLMQ_<SECTION>_<KEY> < command-line flags"
check "unknown flag" 2 "$LLMQ_BIN" config --frobnicate
has "unknown flag named" "--frobnicate"
check "--set without =" 2 "$LLMQ_BIN" config --set engine.block_size
has "--set without = says why" "--set wants SECTION.KEY=VALUE"
check "stray argument" 2 "$LLMQ_BIN" config extra
check "--keys with --check" 2 "$LLMQ_BIN" config --keys --check
check "-c without a file" 2 "$LLMQ_BIN" config -c

# ---- the example file: loads, documents every key, and a comment on every key
check "example --check" 0 "$LLMQ_BIN" config -c "$conf" --check
[ "$out" = "ok" ] && ok "example prints ok" || bad "example --check printed: $out"
keys=$("$LLMQ_BIN" config --keys | awk -F'`' '/^\| `/{print $2}' | grep -v '^templates\.' | sort)
nkeys=$(printf '%s\n' "$keys" | wc -l)
[ "$nkeys" -gt 60 ] && ok "--keys lists $nkeys keys" || bad "--keys lists only $nkeys keys"
infile=$(awk '/^[a-z_]+:/{sec=$1; sub(":","",sec)} /^  [a-z_]+:/{k=$1; sub(":","",k); if (sec!="templates") print sec "." k}' "$conf" | sort)
if [ "$keys" = "$infile" ]; then ok "conf/llmq.yaml has exactly the keys of --keys"; else
  bad "conf/llmq.yaml and --keys differ: $(diff <(echo "$keys") <(echo "$infile") | tr '\n' ' ')"; fi
uncommented=$(awk '/^  [a-z_]+:/ && prev !~ /^ *#/ && $0 !~ /#/ {print FILENAME ":" NR ": " $1} {prev=$0}' "$conf")
[ -z "$uncommented" ] && ok "every key in conf/llmq.yaml has a comment" || bad "keys without a comment: $uncommented"
# the origin comments point at the real lines of the file
line=$(grep -n '^  block_size:' "$conf" | cut -d: -f1)
check "example printed" 0 "$LLMQ_BIN" config -c "$conf"
printf '%s\n' "$out" | grep -Eq "^  block_size: 32 +# $conf:$line\$" && ok "origin file:line" ||
  bad "block_size line does not say $conf:$line: $(printf '%s\n' "$out" | grep block_size)"

# ---- the --keys reference
check "--keys" 0 "$LLMQ_BIN" config --keys
has "--keys header" "| key | type | default | bounds | environment | meaning |"
has "--keys block_size" '| `engine.block_size` | integer | `32` | [8, 256], a power of two | `LLMQ_ENGINE_BLOCK_SIZE` |'
has "--keys redis.url" '`LLMQ_REDIS_URL`'
has "--keys escapes |" 'auto\|cpu\|cuda'
# docs/CONFIG.md carries the same table
if diff <(printf '%s\n' "$out") <(sed -n '/^| key | type |/,$p' "$LLMQ_SOURCE_DIR/docs/CONFIG.md") >/dev/null; then
  ok "docs/CONFIG.md reference is current"; else bad "docs/CONFIG.md reference differs from llmq config --keys"; fi

# ---- precedence: defaults < file < environment < flags
cat > "$tmp/a.yaml" <<'EOF'
engine:
  block_size: 16
  threads: 3
sqlite:
  path: "/tmp/from-file.db"
EOF
get() { "$LLMQ_BIN" config "$@" 2>&1; }
[ "$(get --get engine.block_size)" = 32 ] && ok "default" || bad "default block_size: $(get --get engine.block_size)"
[ "$(get -c "$tmp/a.yaml" --get engine.block_size)" = 16 ] && ok "file over default" || bad "file over default"
[ "$(LLMQ_ENGINE_BLOCK_SIZE=64 get -c "$tmp/a.yaml" --get engine.block_size)" = 64 ] && ok "env over file" ||
  bad "env over file: $(LLMQ_ENGINE_BLOCK_SIZE=64 get -c "$tmp/a.yaml" --get engine.block_size)"
[ "$(LLMQ_ENGINE_BLOCK_SIZE=64 get -c "$tmp/a.yaml" --set engine.block_size=128 --get engine.block_size)" = 128 ] &&
  ok "flag over env" || bad "flag over env"
[ "$(LLMQ_ENGINE_BLOCK_SIZE=64 get -c "$tmp/a.yaml" --get engine.threads)" = 3 ] && ok "file where env is silent" ||
  bad "file where env is silent"
[ "$(LLMQ_CONFIG="$tmp/a.yaml" get --get sqlite.path)" = /tmp/from-file.db ] && ok "\$LLMQ_CONFIG" ||
  bad "\$LLMQ_CONFIG: $(LLMQ_CONFIG="$tmp/a.yaml" get --get sqlite.path)"
out=$(LLMQ_ENGINE_BLOCK_SIZE=64 LLMQ_REDIS_URL=redis://10.0.0.1:6380/2 "$LLMQ_BIN" config -c "$tmp/a.yaml" \
  --set sqlite.path=/tmp/flag.db 2>&1)
printf '%s\n' "$out" | grep -Eq '^  block_size: 64 +# env LLMQ_ENGINE_BLOCK_SIZE$' && ok "env origin" || bad "env origin: $out"
printf '%s\n' "$out" | grep -Eq "^  threads: 3 +# $tmp/a.yaml:3\$" && ok "file origin" || bad "file origin: $out"
printf '%s\n' "$out" | grep -Eq '^  path: "/tmp/flag.db" +# flag --set sqlite.path$' && ok "flag origin" || bad "flag origin: $out"
printf '%s\n' "$out" | grep -Eq '^  url: "redis://10.0.0.1:6380/2" +# env LLMQ_REDIS_URL$' && ok "env string" || bad "env string: $out"
printf '%s\n' "$out" | grep -Eq '^  max_num_seqs: 512 +# default$' && ok "default origin" || bad "default origin: $out"
# the printed YAML is a config file that gives the same values
printf '%s\n' "$out" > "$tmp/effective.yaml"
again=$("$LLMQ_BIN" config -c "$tmp/effective.yaml" 2>&1 | grep -v '^#' | sed 's/ *#.*$//')
first=$(printf '%s\n' "$out" | grep -v '^#' | sed 's/ *#.*$//')
[ "$again" = "$first" ] && ok "printed config reads back the same" || bad "printed config differs when read back"

# ---- errors: exit 1, file:line: key: what
printf 'engine:\n  threads: 2\n  block_size: 48\n' > "$tmp/bad.yaml"
check "bad file" 1 "$LLMQ_BIN" config -c "$tmp/bad.yaml"
has "bad file message" "$tmp/bad.yaml:3: engine.block_size: 48 is not a power of two between 8 and 256"
check "bad file --check" 1 "$LLMQ_BIN" config -c "$tmp/bad.yaml" --check
has "bad file --check message" "$tmp/bad.yaml:3: engine.block_size: 48"
printf 'engine:\n  blok_size: 16\n' > "$tmp/typo.yaml"
check "unknown key" 1 "$LLMQ_BIN" config -c "$tmp/typo.yaml" --check
has "unknown key message" "$tmp/typo.yaml:2: unknown key 'engine.blok_size' (did you mean 'engine.block_size'?)"
printf 'engine:\n  block_size: 16\n threads: 2\n' > "$tmp/syntax.yaml"
check "malformed YAML" 1 "$LLMQ_BIN" config -c "$tmp/syntax.yaml" --check
has "malformed YAML message" "$tmp/syntax.yaml:3:2: invalid YAML: did not find expected key"
check "missing file" 1 "$LLMQ_BIN" config -c "$tmp/none.yaml"
has "missing file message" "$tmp/none.yaml: cannot open: No such file or directory"
check "bad env" 1 env LLMQ_ENGINE_BLOCK_SIZE=abc "$LLMQ_BIN" config -c "$tmp/a.yaml" --check
has "bad env message" "LLMQ_ENGINE_BLOCK_SIZE: expected an integer, got \"abc\""
check "bad flag value" 1 "$LLMQ_BIN" config --set engine.max_num_seqs=0
has "bad flag value message" "--set engine.max_num_seqs: 0 is out of range [1, 4096]"
check "unknown --set key" 1 "$LLMQ_BIN" config --set engine.blok_size=8
has "unknown --set key message" "--set engine.blok_size: unknown key 'engine.blok_size' (did you mean 'engine.block_size'?)"
check "cross-key rule" 1 "$LLMQ_BIN" config --set worker.heartbeat_interval_s=20 --check
has "cross-key message" "--set worker.heartbeat_interval_s: worker.heartbeat_interval_s (20) must be at most half of worker.heartbeat_ttl_s (30)"
check "env typo warns" 0 env LLMQ_ENGINE_BLOK_SIZE=8 "$LLMQ_BIN" config --check
has "env typo warning" "warning: LLMQ_ENGINE_BLOK_SIZE is not a configuration variable (did you mean LLMQ_ENGINE_BLOCK_SIZE?)"

# ---- --get and secrets
check "--get unknown" 1 "$LLMQ_BIN" config --get engine.blok_size
has "--get unknown message" "unknown key 'engine.blok_size' (did you mean 'engine.block_size'?)"
check "--get template" 0 "$LLMQ_BIN" config -c "$conf" --get templates.summarize
has "--get template text" "{document}"
check "--get missing template" 1 "$LLMQ_BIN" config -c "$conf" --get templates.nope
out=$(LLMQ_REDIS_PASSWORD=hunter2 "$LLMQ_BIN" config --set redis.url=redis://bob:pw%21@h:1/0 2>&1)
printf '%s\n' "$out" | grep -q hunter2 && bad "password printed" || ok "password hidden"
printf '%s\n' "$out" | grep -qF 'url: "redis://bob:****@h:1/0"' && ok "URL password hidden" || bad "URL password: $out"
out=$(LLMQ_REDIS_PASSWORD=hunter2 "$LLMQ_BIN" config --show-secrets 2>&1)
printf '%s\n' "$out" | grep -qF 'password: "hunter2"' && ok "--show-secrets" || bad "--show-secrets: $out"
[ "$(LLMQ_REDIS_PASSWORD=hunter2 get --get redis.password)" = hunter2 ] && ok "--get shows secrets" || bad "--get secret"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
