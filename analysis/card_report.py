"""Writing a score card (issue 32): card.csv, card_seeds.csv, the runs' data, card.png/pdf and card.md.

card.md states what the card is: its scale (toy models and tasks, seeds, budget), the commit, versions, command
and wall time, a plug-in's file hash, and that its scores compare objectives on these diagnostics, not on the
performance of real models.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import pandas as pd

from objbench.analysis.card import CARD_COLUMNS, Measure, format_score, per_seed_table, score_table

REFERENCES_DIR = Path("results/cards")
"""Where reference cards are read from (relative to the working directory: the repository root)."""


def read_references(root: str | Path = REFERENCES_DIR, exclude: Path | None = None) -> dict[str, pd.DataFrame]:
    """Every committed card under ``root`` (a folder per objective holding card.csv), by folder name; ``exclude``
    (the card being written) is left out. A card.csv without the card columns is an error naming it."""
    root = Path(root)
    refs = {}
    for csv in sorted(root.glob("*/card.csv")) if root.is_dir() else []:
        if exclude is not None and csv.parent.resolve() == Path(exclude).resolve():
            continue
        table = pd.read_csv(csv)
        missing = [c for c in CARD_COLUMNS if c not in table.columns]
        if missing:
            raise ValueError(f"{csv}: not a card (missing columns {missing})")
        refs[csv.parent.name] = table
    return refs


def _interval(row) -> str:
    return f"{format_score(row['score'])} [{format_score(row['low'])}, {format_score(row['high'])}]"


def efficiency_line(table: pd.DataFrame) -> str:
    """KL spent per unit of accuracy gained, only where the gain's interval excludes 0 (else why not)."""
    rows = table.set_index("name")
    if not {"kl_to_ref", "pass1_gain"} <= set(rows.index):
        return ""
    kl, gain = rows.loc["kl_to_ref"], rows.loc["pass1_gain"]
    if not (math.isfinite(gain["low"]) and (gain["low"] > 0 or gain["high"] < 0)):
        return ("Drift efficiency: the accuracy gain's interval includes 0, so no KL-per-gain ratio is given; read "
                "KL and gain side by side.")
    ratio = format_score(kl["score"] / gain["score"])
    return (f"Drift efficiency: {ratio} nats/token of KL(pi || ref) per unit of held-out "
            f"pass@1 gained (ratio of the two means; the gain's interval excludes 0).")


def measures_table(table: pd.DataFrame, refs: dict[str, pd.DataFrame]) -> list[str]:
    names = list(refs)
    cols = ["diagnostic", "measure", "score [95% t interval]", "seeds", *names]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    ref_scores = {n: r.set_index("name")["score"] for n, r in refs.items()}
    for _, row in table.iterrows():
        cells = [row["diagnostic"], row["name"], _interval(row), str(row["seeds"]),
                 *(format_score(ref_scores[n].get(row["name"], float("nan"))) for n in names)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def definitions(measures: Sequence[Measure], table: pd.DataFrame) -> list[str]:
    unit = table.set_index("name")
    return [f"- **{m.name}** ({m.diagnostic}): {m.definition()}. Unit: {unit.loc[m.name, 'unit']}. High: "
            f"{unit.loc[m.name, 'high_means']}." for m in measures]


def provenance_lines(name: str, settings: dict, plugins, command: str, seconds: float, battery: Path,
                     runs, cpu: str) -> list[str]:
    from objbench.analysis.provenance import format_seconds, git_state, library_versions

    git = git_state()
    dirty = f" (dirty tree: {', '.join(git['changed'][:5])})" if git["dirty"] else ""
    versions = ", ".join(f"{k} {v}" for k, v in library_versions().items())
    seeds = sorted({int(s) for s in runs.configs["seed"]}) if len(runs.configs) else []
    lines = [f"- Objective: `{name}`; settings: "
             + (", ".join(f"`{k}={v}`" for k, v in settings.items()) or "the grpo preset as it is"),
             f"- Battery: `{battery.name}` ({len(runs.configs)} runs, seeds {seeds[0]}-{seeds[-1]})" if seeds else
             f"- Battery: `{battery.name}` (no runs)",
             f"- Commit {git['commit'] or 'unknown'}{dirty}; "
             f"{versions}; CPU {cpu or 'not recorded'}",
             f"- Command: `{command or 'objbench card'}`; wall time of this invocation {format_seconds(seconds)} "
             "(runs already finished by an earlier invocation are read, not rerun)"]
    for p in plugins or ():
        lines.append(f"- Plug-in `{p.spec}` ({p.kind}" + (f", sha256 {p.sha256}" if p.sha256 else "") + ")")
    return lines


SCALE_NOTE = (
    "**Scale.** Every arm trains objbench's toy policy (a ~0.13M-parameter Llama with a character tokenizer) on "
    "synthetic arithmetic tasks for a few hundred steps, from cached warm starts, over the seeds listed above. The "
    "scores compare objectives on these diagnostics at this scale; they are not measurements of how an objective "
    "performs on real language models, and a difference smaller than the intervals is not resolved.")


def render_card(name: str, table: pd.DataFrame, measures: Sequence[Measure], refs: dict[str, pd.DataFrame],
                provenance: list[str]) -> str:
    lines = [f"# Score card: {name}", "", *provenance, "", SCALE_NOTE, "", "![card](card.png)", "",
             "Scores: mean over seeds with a 95% Student t interval (per seed: the measure, or the paired "
             "difference it declares). Reference columns: committed cards (results/cards/), drawn as marks in the "
             "figure." if refs else "Scores: mean over seeds with a 95% Student t interval (per seed: the measure, "
             "or the paired difference it declares). No reference cards were found (results/cards/).", "",
             *measures_table(table, refs), ""]
    eff = efficiency_line(table)
    if eff:
        lines += [eff, ""]
    lines += ["## Definitions (declared in the battery before any card was made)", "", *definitions(measures, table),
              "", "Data: card.csv (this table), card_seeds.csv (every measure per seed), runs.csv.gz and "
              "runs_meta.json (every run's metrics and config), card_spec.yaml (the sweep that was run)."]
    return "\n".join(lines) + "\n"


def write_card(runs, measures: Sequence[Measure], out: str | Path, *, name: str, settings: dict, plugins=(),
               command: str = "", seconds: float = float("nan"), battery: Path = Path("battery.yaml"),
               references: str | Path = REFERENCES_DIR, cpu: str = "") -> Path:
    """Score ``runs`` and write the card's files into ``out``; returns card.md's path."""
    from objbench.analysis.card_figure import plot_card
    from objbench.analysis.data import write_data
    from objbench.analysis.plots import save_figure

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    per_seed = per_seed_table(runs, measures)  # each measure's values computed once, for both files
    table = score_table(per_seed, measures)
    table.to_csv(out / "card.csv", index=False, lineterminator="\n")
    per_seed.to_csv(out / "card_seeds.csv", index=False, lineterminator="\n")
    write_data(runs, out, source={"card": name, "settings": settings})
    refs = read_references(references, exclude=out)
    fig = plot_card(table, refs, title=f"score card: {name}")
    save_figure(fig, out, "card.png", dpi=150)
    prov = provenance_lines(name, settings, plugins, command, seconds, Path(battery), runs, cpu)
    (out / "card.md").write_text(render_card(name, table, measures, refs, prov))
    return out / "card.md"
