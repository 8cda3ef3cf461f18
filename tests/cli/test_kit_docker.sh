#!/usr/bin/env bash
# contrib/docker/Dockerfile without a container runtime. Its base images (nvidia/cuda) come from a
# registry that is not reachable where the tests run, and no Debian package lints Dockerfiles
# (hadolint is not packaged), so this test parses the file itself and checks it against the
# repository, the binary and a real worker:
#  - every line is a known instruction (continuations joined), every FROM names its image through
#    build arguments that have defaults, COPY --from names an earlier stage;
#  - every COPY source from the context exists and is not excluded by Dockerfile.dockerignore;
#  - every shared library the built `llmq` names (but the C runtime's) has its package in the
#    runtime stage's apt-get line, so a new dependency cannot be missed there;
#  - every LLMQ_* ENV is a config key's variable (`llmq config` shows it as its source); EXPOSE is
#    metrics.port's default; the entry point and CMD run `llmq worker` on the config COPY puts
#    there; the user is not root; STOPSIGNAL is SIGTERM;
#  - the HEALTHCHECK command, run as the container would run it, exits 0 against a healthy
#    worker's /health and non-zero once /health answers 503 (Redis stopped) and when nothing
#    listens.
. "$(dirname "$0")/worker_lib.sh"
SRC=${LLMQ_SOURCE_DIR:?run through ctest}
DF=$SRC/contrib/docker/Dockerfile
unset LLMQ_METRICS_PORT

readelf -d "$LLMQ" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' >"$T/libs" # the libraries it names itself
"$LLMQ" config --get metrics.port >"$T/port"
python3 - "$DF" "$SRC" "$T/libs" "$(cat "$T/port")" "$T/health.cmd" "$T/env" <<'PY' && ok "the Dockerfile is consistent with the repository and the binary" || bad "Dockerfile"
import fnmatch, json, os, re, shlex, sys
df, src, libs, port, health_out, env_out = sys.argv[1:7]
known = {"FROM", "ARG", "RUN", "WORKDIR", "COPY", "ADD", "ENV", "USER", "VOLUME", "EXPOSE", "STOPSIGNAL",
         "HEALTHCHECK", "ENTRYPOINT", "CMD", "LABEL", "SHELL", "ONBUILD"}
lines, cur = [], ""
for raw in open(df, encoding="utf-8"):
    s = raw.rstrip("\n")
    if not cur and (not s.strip() or s.lstrip().startswith("#")):
        continue
    if s.lstrip().startswith("#"):  # a comment inside a continued instruction
        continue
    if s.endswith("\\"):
        cur += s[:-1] + " "
        continue
    lines.append(cur + s)
    cur = ""
assert not cur, "the file ends inside a continued line"
ins = [(l.split(None, 1)[0].upper(), l.split(None, 1)[1] if len(l.split(None, 1)) > 1 else "") for l in lines]
bad = [i for i, _ in ins if i not in known]
assert not bad, f"unknown instructions {bad}"
args, stages = {}, []
for i, rest in ins:
    if i == "ARG" and "=" in rest:
        k, v = rest.split("=", 1)
        args[k] = v
    if i == "FROM":
        m = re.fullmatch(r"(\S+)(?: AS (\S+))?", rest, re.I)
        for ref in re.findall(r"\$\{(\w+)\}", m.group(1)):
            assert ref in args, f"FROM {m.group(1)}: ${{{ref}}} has no default"
        stages.append(m.group(2))
    if i == "COPY":
        words = rest.split()
        opts = [w for w in words if w.startswith("--")]
        paths = [w for w in words if not w.startswith("--")]
        frm = [o.split("=", 1)[1] for o in opts if o.startswith("--from=")]
        if frm:
            assert frm[0] in stages[:-1], f"COPY --from={frm[0]}: no earlier stage of that name"
            continue
        ignore = [l.strip() for l in open(df + ".dockerignore") if l.strip() and not l.startswith("#")]
        for p in paths[:-1]:
            if p == ".":
                continue
            assert os.path.exists(os.path.join(src, p)), f"COPY {p}: not in the repository"
            hit = [g for g in ignore if fnmatch.fnmatch(p, g) or fnmatch.fnmatch(p, g.lstrip("*/"))]
            assert not hit, f"COPY {p}: excluded by Dockerfile.dockerignore ({hit})"
# the runtime stage: everything after the last FROM
last = max(n for n, (i, _) in enumerate(ins) if i == "FROM")
run = [rest for i, rest in ins[last:] if i == "RUN" and "apt-get install" in rest]
assert len(run) == 1, "the runtime stage installs its packages with one apt-get line"
pkgs = [w for w in run[0].split() if re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", w)]
base = {"libc", "libm", "libpthread", "libdl", "librt", "libgcc_s", "libstdc++", "linux-vdso", "ld-linux-x86-64"}
missing = []
for so in open(libs).read().split():
    name = re.sub(r"\.so(\..*)?$", "", so)
    if name in base:
        continue
    # Debian and Ubuntu name a library's package after it (libyaml-0 -> libyaml-0-2, libmicrohttpd
    # -> libmicrohttpd12t64): the name the package starts with is the library's
    if not any(p.startswith(name) for p in pkgs):
        missing.append(so)
assert not missing, f"linked by llmq but not installed in the runtime stage: {missing}"
rt = ins[last:]
def one(name):
    v = [rest for i, rest in rt if i == name]
    assert len(v) == 1, f"the runtime stage has {len(v)} {name} lines"
    return v[0]
assert one("EXPOSE").split() == [port], f"EXPOSE {one('EXPOSE')}, metrics.port defaults to {port}"
assert one("STOPSIGNAL") == "SIGTERM"
assert one("USER") not in ("root", "0"), "the worker runs as root"
entry, cmd = json.loads(one("ENTRYPOINT")), json.loads(one("CMD"))
conf = [w.split()[-1] for i, w in rt if i == "COPY" and w.split()[0] == "conf/llmq.yaml"]
assert entry == ["/usr/local/bin/llmq"] and cmd[:2] == ["worker", "-c"] and [cmd[2]] == conf, (entry, cmd, conf)
copied = [w.split()[-1] for i, w in rt if i == "COPY" and "--from=" in w]
assert entry[0] in copied, f"{entry[0]} is not copied from the build stage"
env = one("ENV")
pairs = re.findall(r"(\w+)=(\S+)", env)
with open(env_out, "w") as f:
    for k, v in pairs:
        if k.startswith("LLMQ_"):
            f.write(f"{k}={v}\n")
h = one("HEALTHCHECK")
m = re.fullmatch(r"((?:--[\w-]+=\S+\s+)*)CMD\s+(\[.*\])", h)
assert m, f"HEALTHCHECK {h}"
opts = dict(o.lstrip("-").split("=") for o in m.group(1).split())
assert {"start-period", "interval", "timeout", "retries"} <= set(opts), opts
argv = json.loads(m.group(2))
assert "/health" in " ".join(argv), argv
with open(health_out, "w") as f:
    f.write("\0".join(argv))
PY

# every LLMQ_ variable of the image is a config key's
if [ -s "$T/env" ]; then
  mapfile -t envs <"$T/env"
  env "${envs[@]}" "$LLMQ" config >"$T/config.out" 2>&1
  unknown=$(for e in "${envs[@]}"; do grep -q "env ${e%%=*}\b" "$T/config.out" || echo "${e%%=*}"; done)
  [ -z "$unknown" ] && ok "every LLMQ_ ENV of the image sets a config key (${#envs[@]})" || bad "ENV not a config key: $unknown"
else
  bad "no LLMQ_ ENV read from the Dockerfile"
fi

# ---- the HEALTHCHECK against a real worker
[ -s "$T/health.cmd" ] || { bad "no HEALTHCHECK command read from the Dockerfile"; finish; }
mapfile -d '' -t hc <"$T/health.cmd"
redis_start
make_model
write_config
MPORT=$(free_port)
LLMQ_METRICS_PORT=$MPORT worker_start w1
health_passes() { LLMQ_METRICS_PORT=$MPORT timeout 5 "${hc[@]}" 2>/dev/null; }
health_fails() { ! health_passes; }
wait_until "the HEALTHCHECK to pass on a running worker" health_passes && ok "HEALTHCHECK passes on a healthy worker"
redis_stop
wait_until "the HEALTHCHECK to fail with Redis stopped" health_fails && ok "HEALTHCHECK fails while /health answers 503 (Redis stopped)"
kill -TERM "$W_w1"
worker_wait w1
health_fails && ok "HEALTHCHECK fails when nothing listens" || bad "HEALTHCHECK passed with no worker"
finish
