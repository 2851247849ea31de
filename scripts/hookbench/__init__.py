"""The hook's own cost inside vLLM's real classes (`scripts/bench_hook.py` runs it)."""
