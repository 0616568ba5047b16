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

from objbench.experiments.card.measures import CARD_COLUMNS, Measure, format_score, per_seed_table, score_table

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


def validation_status(root: str | Path = REFERENCES_DIR) -> dict[str, str]:
    """Per measure, what the committed validation rounds (``root``/validation*/validation.csv) found: "yes (ROUND:
    HIGH > LOW)" when a round's controls separated over all its seeds, else "no"; a measure no round scored is left
    out. A card marks its unvalidated measures with this, so a reader knows which scores an instrument check backs."""
    status: dict[str, str] = {}
    for csv in sorted(Path(root).glob("validation*/validation.csv")):
        for _, r in pd.read_csv(csv).iterrows():
            if str(r["validated"]).lower() == "true":
                if not status.get(r["measure"], "").startswith("yes"):
                    at_card = "also" if str(r["card_separates"]).lower() == "true" else "not"
                    status[r["measure"]] = (f"yes ({csv.parent.name}: {r['high']} > {r['low']}; {at_card} at "
                                            f"{r['card_seeds']} seeds)")
            else:
                status.setdefault(r["measure"], "no")
    return status


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


def measures_table(table: pd.DataFrame, refs: dict[str, pd.DataFrame], validated: dict[str, str]) -> list[str]:
    names = list(refs)
    cols = ["diagnostic", "measure", "score [95% t interval]", "seeds", "controls separated", *names]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    ref_scores = {n: r.set_index("name")["score"] for n, r in refs.items()}
    for _, row in table.iterrows():
        cells = [row["diagnostic"], row["name"], _interval(row), str(row["seeds"]),
                 validated.get(row["name"], "not validated"),
                 *(format_score(ref_scores[n].get(row["name"], float("nan"))) for n in names)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def definitions(measures: Sequence[Measure], table: pd.DataFrame) -> list[str]:
    unit = table.set_index("name")
    return [f"- **{m.name}** ({m.diagnostic}): {m.definition()}. Unit: {unit.loc[m.name, 'unit']}. High: "
            f"{unit.loc[m.name, 'high_means']}." for m in measures]


def _present(v):
    """A meta value as read from run folders or a data file: None for missing (NaN, empty)."""
    return None if v is None or (isinstance(v, float) and math.isnan(v)) or v == "" else v


def runs_line(runs) -> str:
    """Where the runs came from, from their own meta: the commit(s) they were made at and their wall time (summed,
    and first start to last end), so a card re-scored from its data still says how it was made."""
    from objbench.analysis.provenance import format_seconds, wall_time

    cfg = runs.configs

    def col(name: str) -> list:
        return list(cfg[name]) if name in cfg.columns else [None] * len(cfg)

    commits = sorted({str(c)[:12] for c in map(_present, col("meta.commit")) if c is not None})
    recs = [{"start": _present(a), "end": _present(b), "resumed_from_step": _present(r)}
            for a, b, r in zip(col("meta.start"), col("meta.end"), col("meta.resumed_from_step"))]
    w = wall_time(recs)
    cpus = sorted({str(c) for c in map(_present, col("meta.versions.cpu")) if c is not None})
    resumed = f", {w['runs_resumed']} resumed after a stop" if w["runs_resumed"] else ""
    return (f"- Runs made at commit {', '.join(commits) or 'not recorded'} on CPU {'; '.join(cpus) or 'not recorded'}"
            f"; run wall time {format_seconds(w['total_s'])} summed over {w['runs_timed']} timed runs, "
            f"{format_seconds(w['span_s'])} first start to last end{resumed}")


def provenance_lines(name: str, settings: dict, source: dict, command: str, seconds: float, battery: Path,
                     runs) -> list[str]:
    """The card's header: objective, battery, the runs' commit and time, this invocation's code state, command and
    time, the original command and plug-ins (from ``source``, stored with the data)."""
    from objbench.analysis.provenance import format_seconds, git_state, library_versions

    git = git_state()
    dirty = f" (dirty tree: {', '.join(git['changed'][:5])})" if git["dirty"] else ""
    versions = ", ".join(f"{k} {v}" for k, v in library_versions().items())
    seeds = sorted({int(s) for s in runs.configs["seed"]}) if len(runs.configs) else []
    lines = [f"- Objective: `{name}`; settings: "
             + (", ".join(f"`{k}={v}`" for k, v in settings.items()) or "the grpo preset as it is"),
             f"- Battery: `{battery.name}` ({len(runs.configs)} runs, seeds {seeds[0]}-{seeds[-1]})" if seeds else
             f"- Battery: `{battery.name}` (no runs)",
             runs_line(runs),
             f"- Card written at commit {git['commit'] or 'unknown'}{dirty}; {versions}"]
    made_by = source.get("command") or f"objbench card {name}"
    if command and command != made_by:
        lines.append(f"- Command: `{command}` ({format_seconds(seconds)}), re-scoring the runs made by `{made_by}`")
    else:
        lines.append(f"- Command: `{made_by}`; wall time of this invocation {format_seconds(seconds)} (runs already "
                     "finished by an earlier invocation are read, not rerun)")
    for p in source.get("plugins") or ():
        lines.append(f"- Plug-in `{p['spec']}` ({p['kind']}" + (f", sha256 {p['sha256']}" if p.get("sha256") else "")
                     + ")")
    return lines


def card_source(name: str, settings: dict, command: str, plugins=()) -> dict:
    """What is stored with a card's data (runs_meta.json "source") so ``objbench card --from-data`` can re-score it."""
    return {"card": name, "settings": dict(settings), "command": command,
            "plugins": [{"spec": p.spec, "kind": p.kind, "sha256": p.sha256} for p in plugins or ()]}


SCALE_NOTE = (
    "**Scale.** Every arm trains objbench's toy policy (a ~0.13M-parameter Llama with a character tokenizer) on "
    "synthetic arithmetic tasks for a few hundred steps, from cached warm starts, over the seeds listed above. The "
    "scores compare objectives on these diagnostics at this scale; they are not measurements of how an objective "
    "performs on real language models, and a difference smaller than the intervals is not resolved.")


VALIDATION_NOTE = (
    "\"Controls separated\": whether the battery's validation (results/cards/validation*/validation.md) found the "
    "measure ordering two configurations whose order is known (a pathology on and off) over 10 seeds. A measure "
    "marked no is still the quantity its definition says, but nothing shows it responds to the pathology it is "
    "named for at this scale; read it with that in mind.")


def render_card(name: str, table: pd.DataFrame, measures: Sequence[Measure], refs: dict[str, pd.DataFrame],
                provenance: list[str], validated: dict[str, str]) -> str:
    lines = [f"# Score card: {name}", "", *provenance, "", SCALE_NOTE, "", "![card](card.png)", "",
             "Scores: mean over seeds with a 95% Student t interval (per seed: the measure, or the paired "
             "difference it declares). Reference columns: committed cards (results/cards/), drawn as marks in the "
             "figure." if refs else "Scores: mean over seeds with a 95% Student t interval (per seed: the measure, "
             "or the paired difference it declares). No reference cards were found (results/cards/).", "",
             *measures_table(table, refs, validated), "", VALIDATION_NOTE, ""]
    eff = efficiency_line(table)
    if eff:
        lines += [eff, ""]
    lines += ["## Definitions (declared in the battery before any card was made)", "", *definitions(measures, table),
              "", "Data: card.csv (this table), card_seeds.csv (every measure per seed), runs.csv.gz and "
              "runs_meta.json (every run's metrics and config), card_spec.yaml (the sweep that was run)."]
    return "\n".join(lines) + "\n"


def place_data(runs, out: Path, source: dict, data_from: str | Path | None = None):
    """Put the runs' data (runs.csv.gz, runs_meta.json) into ``out`` and return the runs as read back from it, so a
    card scores exactly what a reader of its data file sees. Runs read from a data file (``data_from``: its folder)
    are not rewritten: the files are copied when ``out`` is another folder."""
    import shutil

    from objbench.analysis.data import DATA_FILE, data_paths, read_data, write_data

    if data_from is None:
        write_data(runs, out, source=source)
        return read_data(out / DATA_FILE)
    if Path(data_from).resolve() != out.resolve():
        for f in data_paths(Path(data_from) / DATA_FILE):
            if f.exists():
                shutil.copyfile(f, out / f.name)
    return runs


def write_card(runs, measures: Sequence[Measure], out: str | Path, *, source: dict, command: str = "",
               seconds: float = float("nan"), battery: Path = Path("battery.yaml"),
               references: str | Path = REFERENCES_DIR, data_from: str | Path | None = None) -> Path:
    """Score ``runs`` and write the card's files into ``out``; returns card.md's path. ``source``
    (:func:`card_source`) names the card, its settings, the command that ran it and its plug-ins; it is stored with
    the data. ``command`` is this invocation's (a re-score from data differs from the one that ran the runs);
    ``data_from`` is the folder of the data file ``runs`` were read from (None: run folders, whose data is written)."""
    from objbench.analysis.plots import save_figure
    from objbench.experiments.card.figure import plot_card

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    name, settings = source["card"], source["settings"]
    runs = place_data(runs, out, source, data_from)
    per_seed = per_seed_table(runs, measures)  # each measure's values computed once, for both files
    table = score_table(per_seed, measures)
    table.to_csv(out / "card.csv", index=False, lineterminator="\n")
    per_seed.to_csv(out / "card_seeds.csv", index=False, lineterminator="\n")
    refs = read_references(references, exclude=out)
    validated = validation_status(references)
    fig = plot_card(table, refs, title=f"score card: {name}",
                    unvalidated={m for m, v in validated.items() if not v.startswith("yes")})
    save_figure(fig, out, "card.png", dpi=150)
    prov = provenance_lines(name, settings, source, command, seconds, Path(battery), runs)
    (out / "card.md").write_text(render_card(name, table, measures, refs, prov, validated))
    return out / "card.md"
