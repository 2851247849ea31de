#!/usr/bin/env bash
# Fuzzes every target in fuzz/ with libFuzzer (through cargo-fuzz, installed once under
# ~/.cache/meridian), FUZZ_RUNS executions each (10 million by default), replaces the
# committed corpus (fuzz/corpus/<target>) with the smallest set of old and new inputs
# that keeps the coverage reached, and writes docs/src/benchmarks/fuzzing.md. A crash
# stops the run; its input lands in fuzz/libfuzzer/artifacts/<target>/ (keep it, once
# fixed, in fuzz/regressions/<target>/, which the test suite replays).
#
#   scripts/fuzz.sh                        the documented run (about an hour on 2 cores)
#   scripts/fuzz.sh --smoke                FUZZ_SMOKE_SECONDS (20) per target, no report;
#                                          fails on any crash (the test command runs it)
#   FUZZ_TARGETS="sse_split config" scripts/fuzz.sh   then: scripts/fuzz.sh --report
#
# cargo-fuzz needs a nightly compiler for its flags; the stable toolchain is told to accept
# them (RUSTC_BOOTSTRAP=1) rather than installing a second toolchain. No sanitizer: the
# code under test has no `unsafe` of its own, and coverage guidance is what matters here.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_FUZZ_VERSION=0.13.2
TOOLS="${HOME}/.cache/meridian/cargo-fuzz-${CARGO_FUZZ_VERSION}"
if [[ ! -x "$TOOLS/bin/cargo-fuzz" ]]; then
    cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION" --root "$TOOLS"
fi
export PATH="$TOOLS/bin:$PATH"
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/fuzz"

smoke=0 report_only=0
[[ "${1:-}" == "--smoke" ]] && smoke=1
# --report: write the page from the logs the last runs left (a run may be split, one
# FUZZ_TARGETS at a time).
[[ "${1:-}" == "--report" ]] && report_only=1
minimise_only=0
# --minimise: shrink the committed corpus as a run would, without fuzzing.
[[ "${1:-}" == "--minimise" ]] && minimise_only=1
targets=(${FUZZ_TARGETS:-sse_split chunk_router config request_body splice})
runs="${FUZZ_RUNS:-10000000}"

# The flags go before the target's own arguments: whatever follows `--` is libFuzzer's.
fuzz() { cargo fuzz "$1" --fuzz-dir fuzz/libfuzzer --sanitizer none --release "${@:2}"; }

out="$CARGO_TARGET_DIR/runs"
mkdir -p "$out"

# The committed corpus becomes a small set of inputs, old and new, that still reaches
# every code edge reached (libFuzzer's merge into an empty directory, counting edges
# only: with hit counts it keeps thousands of inputs, megabytes per target).
minimise() {
    local t="$1" minimal="$CARGO_TARGET_DIR/minimal/$1"
    rm -rf "$minimal" && mkdir -p "$minimal"
    fuzz run "$t" "$minimal" "fuzz/corpus/$t" "${@:2}" -- -merge=1 -use_counters=0 >"$out/$t.merge.log" 2>&1
    rm -rf "fuzz/corpus/$t" && cp -r "$minimal" "fuzz/corpus/$t"
}
((report_only)) || fuzz build
for t in "${targets[@]}"; do
    ((report_only)) && break
    if ((minimise_only)); then
        minimise "$t"
        continue
    fi
    work="$CARGO_TARGET_DIR/corpus/$t"
    mkdir -p "$work"
    if ((smoke)); then
        # Every committed input, then some seconds of new ones (written to $work, so the
        # committed corpus is left alone).
        fuzz run "$t" "$work" "fuzz/corpus/$t" -- -max_total_time="${FUZZ_SMOKE_SECONDS:-20}" -print_final_stats=1 \
            2>&1 | tail -n 12
        continue
    fi
    started=$(date +%s)
    fuzz run "$t" "$work" "fuzz/corpus/$t" -- -runs="$runs" -print_final_stats=1 \
        >"$out/$t.log" 2>&1 || { tail -n 40 "$out/$t.log"; echo "fuzz: $t failed" >&2; exit 1; }
    echo "$(( $(date +%s) - started ))" >"$out/$t.seconds"
    minimise "$t" "$work"
    tail -n 8 "$out/$t.log"
done
((smoke || minimise_only)) && exit 0
((report_only)) || [[ -z "${FUZZ_TARGETS:-}" ]] || exit 0

python3 - "$out" "$runs" "${targets[@]}" <<'PY'
import pathlib, re, sys, datetime, os
out, runs, targets = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
what = {
    "sse_split": "SSE decoder: the same payloads and [DONE] verdict however the stream is cut",
    "chunk_router": "chunk parser and phase router over arbitrary byte splits: the same events and counts",
    "config": "config loader and validation (TOML text plus --set overrides): a config or an error",
    "request_body": "request body handling: parse, then the upstream and hook bodies (JSON objects, extension removed)",
    "splice": "continuation splice of two legs: chunks rewritten or dropped, the first leg's id kept",
}
rows = []
for t in targets:
    log = (out / f"{t}.log").read_text(errors="replace")
    stat = lambda k: int(re.search(rf"stat::{k}:\s+(\d+)", log).group(1))
    seconds = int((out / f"{t}.seconds").read_text())
    crashes = len(list(pathlib.Path(f"fuzz/libfuzzer/artifacts/{t}").glob("*"))) if pathlib.Path(f"fuzz/libfuzzer/artifacts/{t}").exists() else 0
    corpus = len(list(pathlib.Path(f"fuzz/corpus/{t}").iterdir()))
    rows.append((t, stat("number_of_executed_units"), seconds, stat("average_exec_per_sec"), stat("peak_rss_mb"), crashes, corpus))
cpu = os.cpu_count()
lines = [
    "# Fuzzing",
    "",
    f"Generated by `scripts/fuzz.sh` on {datetime.date.today().isoformat()}: libFuzzer through cargo-fuzz, "
    f"{runs:,} executions per target, on the development machine ({cpu} cores). Each target "
    "(`fuzz/src/lib.rs`) feeds arbitrary bytes to one parser the way the proxy does and checks "
    "what the proxy relies on; a crash is any panic or failed check. What added coverage is "
    "kept in the committed corpus (`fuzz/corpus/<target>/`, minimised to a small set that still "
    "reaches every code edge reached), which the test suite replays through every target "
    "(`fuzz/tests/corpus.rs`) together with the inputs of crashes found and fixed "
    "(`fuzz/regressions/<target>/`).",
    "",
    "| target | what it checks | executions | seconds | executions/s | peak RSS (MB) | crashes | corpus inputs |",
    "|---|---|---:|---:|---:|---:|---:|---:|",
]
for t, n, s, eps, rss, crashes, corpus in rows:
    lines.append(f"| `{t}` | {what[t]} | {n:,} | {s} | {eps:,} | {rss} | {crashes} | {corpus} |")
total = sum(r[5] for r in rows)
fixed = {t: sorted(p.name for p in pathlib.Path(f"fuzz/regressions/{t}").glob("*")) for t in targets}
fixed = {t: names for t, names in fixed.items() if names}
lines += ["", f"Crashes over all targets: {total}." + ("" if total else " Every target ran its executions to the end."), "",
          ("Crashes found by earlier runs, fixed, and kept as regression inputs (`fuzz/regressions/`): "
           + "; ".join(f"`{t}`: " + ", ".join(f"`{n}`" for n in names) for t, names in fixed.items()) + "."
           if fixed else "No crash has been found by earlier runs."), "",
          "Reproduce: `scripts/fuzz.sh` (or `FUZZ_TARGETS=config FUZZ_RUNS=1000000 scripts/fuzz.sh`); "
          "`scripts/fuzz.sh --smoke` runs each target for 20 seconds without writing this page.", ""]
pathlib.Path("docs/src/benchmarks/fuzzing.md").write_text("\n".join(lines))
print("\n".join(lines))
PY
