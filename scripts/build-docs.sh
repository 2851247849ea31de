#!/usr/bin/env bash
# Builds the book (docs/) with a pinned mdBook, installed once from crates.io into
# ~/.cache/meridian/mdbook-<version> (keyed by version; later runs reuse it).
#   scripts/build-docs.sh            # -> docs/book/
# The build fails on a chapter listed in SUMMARY.md whose file is missing
# (book.toml: create-missing = false) and on any warning mdBook prints; links inside
# pages are checked by tests/python/test_docs.py.
set -euo pipefail
cd "$(dirname "$0")/.."
MDBOOK_VERSION=0.5.4
CACHE="${MERIDIAN_CACHE:-$HOME/.cache/meridian}"
ROOT_DIR="$CACHE/mdbook-$MDBOOK_VERSION"
if [[ ! -x "$ROOT_DIR/bin/mdbook" ]]; then
  echo "installing mdBook $MDBOOK_VERSION into $ROOT_DIR (once)" >&2
  # Only the `search` feature: the book is built, never served or watched from here.
  cargo install mdbook --version "$MDBOOK_VERSION" --locked --no-default-features \
    --features search --root "$ROOT_DIR" --quiet
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! "$ROOT_DIR/bin/mdbook" build docs 2>&1 | tee "$log"; then
  echo "mdbook build failed" >&2
  exit 1
fi
if grep -E '^(\S+ )?(WARN|ERROR)|\b(WARN|ERROR)\b' "$log" >/dev/null; then
  echo "mdbook build printed warnings or errors (see above): treating them as failures" >&2
  exit 1
fi
