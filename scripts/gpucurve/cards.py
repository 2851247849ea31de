"""Other cards beside the main measurement: the same step shapes timed on another GPU
(`python3 -m gpucurve measure --out gpu-step-curve/<card>`, with a second run's
`steps-graph.jsonl` kept as `repeat1-steps-graph.jsonl` and `fused` into the same
folder), fitted to the twin's cost model the same way, and set beside the main card term
by term and shape by shape. The ratios the scheduling policies turn on (a prompt chunk
over a decode step, decode growth with the batch, the weight-read floor) are compared,
since they, not the milliseconds, decide whether an effect measured on one card carries
to another."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from .trace import groups, read_trace


def card_dirs(data: Path) -> list[Path]:
    """The other cards' measurements kept under the main one's folder."""
    return sorted(p.parent for p in data.glob("*/meta.json") if (p.parent / "steps-graph.jsonl").exists())


def profile_name(device: str) -> str:
    """The fitted profile's name for a device ("NVIDIA H200" -> "h200-qwen3-8b-pytorch")."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower().removeprefix("nvidia ")).strip("-")
    return f"{slug.split('-')[0] or 'gpu'}-qwen3-8b-pytorch"


def _median_ratio(pairs: list[tuple[float, float]]) -> tuple[float, float, float] | None:
    ratios = [a / b for a, b in pairs if b > 0]
    return (statistics.median(ratios), min(ratios), max(ratios)) if ratios else None


def regime(steps: dict[tuple, dict], fitted: dict) -> dict[str, float | None]:
    """The ratios that decide scheduling, from the measured shapes' medians."""
    def at(b: int, l: int, n: int, c: int) -> float | None:
        s = steps.get((b, l, n, c))
        return s["step_s"] if s else None

    one, sixty_four, chunk = at(1, 1024, 0, 0), at(64, 1024, 0, 0), at(0, 0, 2048, 0)
    return {
        "chunk_over_decode": chunk / one if chunk and one else None,
        "growth_64": sixty_four / one if sixty_four and one else None,
        "floor_tokens": fitted.get("weight_read_tokens"),
        "decode_ms": one * 1e3 if one else None,
    }


def card_section(card: Path, main_meta: dict, main_steps: dict[tuple, dict], main_fitted: dict,
                 fit_card) -> list[str]:
    """The page's lines for one other card. `fit_card(card_dir, meta, name)` fits the
    twin's model to its graph trace and returns (profile, fit figures)."""
    meta = json.loads((card / "meta.json").read_text())
    facts, main_facts = meta["facts"], main_meta["facts"]
    device, main_device = facts.get("device", card.name), main_facts.get("device", "the main card")
    if meta.get("config") != main_meta.get("config"):
        return [f"`{card.name}/` measured another model shape than the main card: not compared."]
    fitted, fit = fit_card(card, meta, profile_name(device))
    steps = groups(read_trace(card / "steps-graph.jsonl"))
    repeats = sorted(card.glob("repeat*-steps-graph.jsonl"))
    moved = []
    for path in repeats:
        again = groups(read_trace(path))
        moved += [abs(again[k]["step_s"] / s["step_s"] - 1) for k, s in steps.items() if k in again]
    common = [k for k in steps if k in main_steps]
    by_class = {
        "decode-only steps": [k for k in common if k[2] == 0],
        "prompt-chunk steps": [k for k in common if k[0] == 0],
        "mixed steps": [k for k in common if k[0] and k[2]],
    }
    short = device.removeprefix("NVIDIA ")
    main_short = main_device.removeprefix("NVIDIA ").split(" ")[0]

    def term(key: str, scale: float, unit: str) -> str:
        a, b = main_fitted.get(key, 0.0), fitted.get(key, 0.0)
        return f"| `{key}` | {a * scale:.4g} {unit} | {b * scale:.4g} {unit} | {b / a:.2f}x |" if a else \
            f"| `{key}` | {a * scale:.4g} {unit} | {b * scale:.4g} {unit} | n/a |"

    out = [f"## A second card: {device}", "",
           f"The same {len(steps)} step shapes timed on an {device} ({facts.get('memory_gib', '?')} GiB; measured "
           f"beside the steps: a device-to-device copy at {facts.get('copy_tb_s', '?')} TB/s and an 8192³ bf16 "
           f"matmul at {facts.get('matmul_tflops', '?')} TFLOP/s, against {main_facts.get('copy_tb_s', '?')} and "
           f"{main_facts.get('matmul_tflops', '?')} on the {main_short}), PyTorch {facts.get('torch', '?')}; data and "
           f"fitted profile in `gpu-step-curve/{card.name}/` (`--profile {profile_name(device)}`). "
           + (f"A second run of the whole curve moved a shape's median by {statistics.median(moved):.1%} at the "
              f"median shape, {max(moved):.1%} at most. " if moved else "")
           + f"Fit: median |error| {fit['median_abs_pct_error']:.1f}%, R² {fit['r_squared']:.3f} over "
           f"{fit['samples']} timed steps. The profile's engine limits (KV blocks, sequences, step budget) are "
           f"the {main_short} datasheet profile's, not scaled to this card's memory: it prices steps, it does "
           "not size a cache.", "",
           f"| term | {main_short} fitted | {short} fitted | {short} / {main_short} |", "|---|---|---|---|",
           term("fixed_s", 1e3, "ms"), term("per_token_s", 1e6, "µs"), term("per_decode_request_s", 1e6, "µs"),
           term("per_context_token_s", 1e9, "ns"), term("per_prefill_attention_s", 1e12, "ps"),
           term("weight_read_tokens", 1, "tokens"), "",
           f"| step class | shapes | {short} / {main_short} step time, median (range) |", "|---|---:|---|"]
    ratios = {label: _median_ratio([(steps[k]["step_s"], main_steps[k]["step_s"]) for k in keys])
              for label, keys in by_class.items()}
    for label, keys in by_class.items():
        if r := ratios[label]:
            out.append(f"| {label} | {len(keys)} | {r[0]:.2f} ({r[1]:.2f}-{r[2]:.2f}) |")
    mine, theirs = regime(steps, fitted), regime(main_steps, main_fitted)
    out += ["", f"| ratio that decides scheduling | {main_short} | {short} |", "|---|---:|---:|"]
    rows = [("a 2,048-token chunk over one decode (x 1,024 cached)", "chunk_over_decode", "{:.1f}"),
            ("64 decodes over one (x 1,024 cached)", "growth_64", "{:.2f}"),
            ("weight-read floor, tokens", "floor_tokens", "{:.0f}"),
            ("one decode, ms", "decode_ms", "{:.2f}")]
    for label, k, fmt in rows:
        a, b = theirs.get(k), mine.get(k)
        out.append(f"| {label} | {fmt.format(a) if a is not None else '-'} | {fmt.format(b) if b is not None else '-'} |")
    fused = card / "fused.json"
    if fused.exists() and json.loads(fused.read_text()).get("device") == device:
        f = json.loads(fused.read_text())["steps"]
        out += ["", f"Fused (`torch.compile`, then a graph) on the {short}: "
                + "; ".join(f"{'one decode' if s['decode_reqs'] == 1 else str(s['decode_reqs']) + ' decodes' if s['decode_reqs'] else str(s['prefill_tokens']) + '-token chunk'}"
                            f" {s['plain_ms']:.2f} -> {s['fused_ms']:.2f} ms" for s in f) + "."]
    chunk_ratio, decode_ratio = ratios["prompt-chunk steps"], ratios["decode-only steps"]
    if chunk_ratio and decode_ratio:
        if decode_ratio[0] < chunk_ratio[0] - 0.05:
            read = (f"the {short}'s faster memory shortens the steps that read weights and KV (decode-only "
                    f"steps {decode_ratio[0]:.2f}x the {main_short}'s at the median) while compute-bound prompt "
                    f"chunks stay near where they were ({chunk_ratio[0]:.2f}x). A chunk therefore costs more "
                    "decode steps on this card: a long chunk is a larger stall for the answers beside it, not a "
                    "smaller one.")
        else:
            read = (f"decode-only steps run {decode_ratio[0]:.2f}x and prompt chunks {chunk_ratio[0]:.2f}x the "
                    f"{main_short}'s at the median: the balance between a chunk and a decode step is about the same.")
        out += ["", f"Read: {read} The policies page forecasts its workloads on both cards' fitted profiles."]
    return out
