"""The README's real-engine summary, written from the page's data: for each kept set,
workload, load and configuration (a set whose results.json says `"superseded": true`
is left out), its do-no-harm verdict and every cost and gain whose interval says so;
and the block between the README's markers that holds it (`policies report`). In the
README (`readme_lines`), the shipped default (`hook` running `meridian.toml`'s policy
with its settings as shipped) comes first, and comparisons that resolve
nothing are folded: the default's into one line per set and workload naming the loads,
every other configuration's into one count, so that what was resolved, costs first,
stands out."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from . import speed
from . import stats as S
from .effects import effects_of, plain_effects, policies_of
from .measure import shipped_policy
from .sets import read


@dataclass(frozen=True)
class Summary:
    """One comparison with stock: a configuration at one workload and load of one set."""

    workload: str
    label: str  # "at 90% load", with where its rounds stood
    load: float
    config: str
    policy: str | None
    name: str  # the configuration as the README names it, with its policy
    set_name: str
    harm: str  # the do-no-harm verdict's word
    costs: tuple[str, ...]
    gains: tuple[str, ...]
    stood_only: bool = False  # judged on only the rounds that stood at the load

    def line(self) -> str:
        return (f"- {self.workload} {self.label}, {self.name} against stock (set `{self.set_name}`): "
                f"do no harm: {self.harm}; costs: {'; '.join(self.costs) or 'none resolved'}; gains: "
                f"{'; '.join(self.gains) or 'none resolved'}.")

    def resolves_nothing(self) -> bool:
        return self.harm == "unresolved" and not self.costs and not self.gains


def summary_lines(page_dir: Path, resamples: int = 2000) -> list[str]:
    """One line per set, workload, load and configuration (sets marked `superseded` left
    out): its do-no-harm verdict, and every cost and gain whose interval says so; where
    some of a load's rounds stood elsewhere on their own machines (`speed.standings`),
    the loads they stood at, and a second line judging only the rounds that stood at the
    load."""
    return [s.line() for s in summaries(page_dir, resamples)]


def readme_lines(page_dir: Path, resamples: int = 2000) -> list[str]:
    """The README's summary: the shipped default's comparisons first, then the other
    configurations'; a comparison that resolves nothing is folded (the default's into one
    line per set and workload naming its loads, the others' into one count at the end)."""
    every = summaries(page_dir, resamples)
    # The default as `meridian.toml` ships it; a set that ran `hook` with other settings
    # (an experiment on the default's parameters) is listed among the others.
    shipped = shipped_policy()
    default = [s for s in every if s.config == "hook" and s.policy == shipped]
    others = [s for s in every if s not in default]
    out: list[str] = []
    folded: dict[tuple[str, str, str], list[Summary]] = {}
    for s in default:
        if s.resolves_nothing():
            folded.setdefault((s.set_name, s.workload, s.name), []).append(s)
        else:
            out.append(s.line())
    for (set_name, workload, name), group in folded.items():
        out.append(f"- {workload} at {_folded_loads(group, default)}, {name} against stock (set `{set_name}`): "
                   "do no harm: unresolved; no cost and no gain resolved.")
    quiet = [s for s in others if s.resolves_nothing()]
    out.extend(s.line() for s in others if not s.resolves_nothing())
    if quiet:
        # Each named as its own line would name it: `hook` with settings the default does not
        # ship carries its policy, so that it is not read as the default.
        configs = sorted({s.name for s in quiet})
        out.append(f"- {len(quiet)} other comparisons ({', '.join(configs)} at their workloads "
                   "and loads) resolve neither a cost nor a gain; the page shows each.")
    return out


def _folded_loads(group: list[Summary], every: list[Summary]) -> str:
    """The loads of one set's folded comparisons ("50%, 90% load"). A load judged two
    ways (all its rounds, and only those that stood at it) whose two lines both resolve
    nothing is folded once for both; where only one of them does, its folded line names
    which rounds it judged, since the other view's line, printed above it, says more."""
    mine = (group[0].set_name, group[0].workload, group[0].name)
    views = {(s.load, s.stood_only) for s in group}
    judged = {(s.load, s.stood_only) for s in every if (s.set_name, s.workload, s.name) == mine}
    both = " (all its rounds, and only those that stood at the load)"

    def qualifier(load: float) -> str:
        pair = {(load, False), (load, True)}
        if pair <= views:
            return both
        if pair <= judged:
            return " (only the rounds that stood at it)" if (load, True) in views else " (all its rounds)"
        return ""

    words = {load: qualifier(load) for load in sorted({s.load for s in group})}
    # Said once at the end where no load's line leaves out one of its views.
    if set(words.values()) <= {"", both}:
        return (", ".join(f"{100 * x:.0f}%" for x in words) + " load"
                + (both if both in words.values() else ""))
    return "; ".join(f"{100 * x:.0f}% load{q}" for x, q in words.items())


def summaries(page_dir: Path, resamples: int = 2000) -> list[Summary]:
    """Each comparison of `summary_lines`, as a record."""
    measured: dict[tuple[str, str, float, str], Path] = {}
    standing: dict[str, dict] = {}
    for set_dir in sorted(p for p in page_dir.iterdir() if (p / "results.json").exists()):
        data = json.loads((set_dir / "results.json").read_text())
        if data.get("superseded"):
            continue
        standing[set_dir.name] = speed.standings(set_dir, data) if (set_dir / "steps").is_dir() else {}
        for r in data["runs"]:
            if r["config"] != "stock":
                measured[(set_dir.name, r["workload"], r["load"], r["config"])] = set_dir
    out: list[Summary] = []
    for (_, workload, load, config), set_dir in sorted(measured.items()):
        every, _ = read(set_dir / "raw", workload, load)
        if "stock" not in every or config not in every:
            continue
        policy = policies_of(json.loads((set_dir / "results.json").read_text())).get(config)
        name = f"`{config}`" + (f" (policy `{policy}`)" if policy and not config.endswith(policy) else "")
        at = standing[set_dir.name]
        stood = sorted(s.load for (w, x, _rnd, c), s in at.items()
                       if w == workload and x == load and c == "stock" and s.load is not None)
        off = speed.off_load(at, workload, load)
        span = (f"{100 * stood[0]:.0f}%" if stood and round(100 * stood[0]) == round(100 * stood[-1])
                else f"{100 * stood[0]:.0f}-{100 * stood[-1]:.0f}%" if stood else "")
        where = f" (its rounds stood at {span} of their own machine's capacity)" if off and stood else ""
        kept = set(every["stock"]) - off
        views = [(f"at {load * 100:.0f}% load{where}", every, False)]
        if off and len(kept & set(every[config])) >= 2:
            views.append((f"at {load * 100:.0f}% load, only the rounds that stood at it ({', '.join(map(str, sorted(kept)))})",
                          {c: {r: v for r, v in by.items() if r in kept} for c, by in every.items()}, True))
        for label, runs, stood_only in views:
            table, judged = effects_of(set_dir / "raw", workload, load, runs, config, resamples)
            costs, gains = plain_effects(table)
            harm = S.do_no_harm(judged)
            out.append(Summary(workload, label, load, config, policy, name, set_dir.name, harm.word,
                               tuple(costs), tuple(gains), stood_only))
    return out


README_START = "<!-- realab policies: generated by `python -m realab policies report`; do not edit -->"
README_END = "<!-- end realab policies -->"


def write_readme_block(readme: Path, lines: list[str]) -> None:
    """Replaces the text between the README's markers with `lines`."""
    text = readme.read_text()
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise SystemExit(f"{readme}: no generated block ({README_START!r} ... {README_END!r})")
    block = "\n".join([README_START, *lines, README_END])
    readme.write_text(text[:start] + block + text[end + len(README_END):])
