#!/usr/bin/env bash
# When does migration pay (issue 29, item 5): the engine twin in virtual time, the same
# four H100 engines as one pool against think and answer pools (answers handed over at
# the end of the thought, by re-prefill or by a KV connector), for each workload, at
# loads relative to the one pool's capacity, the same seeds on both sides. Writes the
# tables docs/src/benchmarks/migration-twin.md includes. Deterministic; about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p meridian-sim >&2
out=docs/src/benchmarks/migration-twin
mkdir -p "$out"
sim=target/release/meridian-sim
common=(migration --profile h100-qwen3-8b --engines 4 --think 2,3 --loads 0.5,0.8,0.95 --num-prompts 2000 --seeds 5)
for w in default long-prompts long-reasoning; do
  "$sim" "${common[@]}" --workload "loadtest/twin/workloads/$w.toml" --report "$out/$w.txt" > /dev/null
  echo "wrote $out/$w.txt" >&2
done
# A slower connector (1 GB/s: across nodes over TCP) on the default mix.
"$sim" "${common[@]}" --moves connector --connector-gb-s 1 --workload loadtest/twin/workloads/default.toml \
  --report "$out/default-1gbs.txt" > /dev/null
echo "wrote $out/default-1gbs.txt" >&2
