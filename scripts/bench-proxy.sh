#!/usr/bin/env bash
# Measures what the proxy adds against direct and against nginx as a pass-through proxy
# (same machine, same run) for every target of issue 15, and writes
# docs/src/benchmarks/proxy-overhead.md. A few minutes after the build. Installing nginx
# needs root (apt-get); with nginx already on the PATH it does not.
set -euo pipefail
cd "$(dirname "$0")/.."
# nginx from Debian, the yardstick; installed once (the bench runs as root).
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
    apt-get update -qq
    apt-get install -y -qq nginx-light >/dev/null
fi
# 10,000 streams held through a proxy need more descriptors than the usual soft limit.
ulimit -n "$(ulimit -Hn)"
cargo build --release --locked --bins
# The stack alone, doing nothing but forward: the floor the report compares against.
cargo build --release --locked -p meridian-proxy --example bare_relay
cargo bench --locked -p meridian-proxy --bench relay_overhead -- "$@"
