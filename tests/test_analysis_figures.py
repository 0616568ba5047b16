"""analysis.plots: signed metrics are never clipped, grids of at most three readable columns, arms apart by colour
and dash style, the paired-difference figure, and a PDF beside every PNG."""

import numpy as np
import pandas as pd
import pytest

from objbench.analysis.plots import (
    LINE_STYLES,
    MAX_COLUMNS,
    PANEL_SIZE,
    arm_colors,
    metric_bounds,
    plot_paired_differences,
    plot_panels,
    save_figure,
)


def test_bounds_come_from_the_metric_definition_not_its_prefix():
    assert metric_bounds("length/filler_gap") is None  # wrong minus right filler: signed (issue 31)
    assert metric_bounds("length/filler_incorrect") == (0.0, None)
    assert metric_bounds("eval/pass@1") == (0.0, 1.0) and metric_bounds("reward/acc_d2") == (0.0, 1.0)
    assert metric_bounds("kl/k1") is None and metric_bounds("kl/exact") == (0.0, None)
    assert metric_bounds("reward/acc_diff") is None


def _curves(arms, steps=(0, 1, 2)):
    return pd.DataFrame([{"arm": a, "step": s, "mean": -1.0 + i, "low": -2.0 + i, "high": i, "n": 10}
                         for i, a in enumerate(arms) for s in steps])


def test_grid_has_at_most_three_columns_of_readable_panels_and_arms_differ_in_dash_style():
    arms = ["a", "b", "c", "d", "e"]
    fig, axes = plot_panels([("t", "y", _curves(arms))] * 10, arm_colors(arms), ncols=5)
    assert axes.shape == (4, MAX_COLUMNS) == (4, 3)
    w_in = axes[0, 0].get_position().width * fig.get_figwidth()
    assert w_in == pytest.approx(PANEL_SIZE[0]) and PANEL_SIZE[0] == 3.3
    styles = [line.get_linestyle() for line in axes[0, 0].get_lines()]
    assert styles == ["-", "--", "-.", ":", "-"] and LINE_STYLES == ("-", "--", "-.", ":")
    # a signed metric's band is drawn as computed: nothing clipped at 0 when no bounds are given
    band = axes[0, 0].collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == pytest.approx(-2.0)


def test_paired_difference_figure_draws_every_seed_and_both_intervals(tmp_path):
    table = pd.DataFrame([
        {"a": "x", "comparison": "x - base", "endpoint": "m (final)", "d": "0.1 0.3 -0.2", "mean": 0.2 / 3,
         "t_low": -0.5, "t_high": 0.6, "t_adj_low": -0.9, "t_adj_high": 1.0},
        {"a": "y", "comparison": "y - base", "endpoint": "m (final)", "d": "1.0 1.2 0.8", "mean": 1.0,
         "t_low": 0.5, "t_high": 1.5, "t_adj_low": 0.2, "t_adj_high": 1.8},
        {"a": "x", "comparison": "x - base", "endpoint": "m (auc)", "d": "0 0 0", "mean": 0.0,
         "t_low": 0.0, "t_high": 0.0, "t_adj_low": 0.0, "t_adj_high": 0.0}])
    fig, axes = plot_paired_differences(table, arm_colors(["base", "x", "y"]), title="t")
    ax = axes.flat[0]
    dots = np.concatenate([c.get_offsets()[:, 0] for c in ax.collections])
    assert sorted(dots) == sorted([0.1, 0.3, -0.2, 1.0, 1.2, 0.8])
    lines = [tuple(line.get_xdata()) for line in ax.get_lines()]
    assert (-0.9, 1.0) in lines and (-0.5, 0.6) in lines and (0.2, 1.8) in lines  # adjusted and 95% bars
    assert [t.get_text() for t in ax.get_yticklabels()] == ["y - base", "x - base"]  # table order, top down
    # the second endpoint lacks "y - base": its row is empty, the rows still line up with the first panel's
    assert len(axes.flat[1].collections) == 1 and {t.get_text() for t in axes.flat[1].get_yticklabels()} == {""}
    save_figure(fig, tmp_path, "p.png", 80)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "p.pdf").read_bytes()[:4] == b"%PDF"


@pytest.mark.parametrize("n_panels", [1, 3])
def test_a_long_title_fits_inside_a_figure_one_panel_wide(n_panels):
    """The SmolLM2 reports' per-difficulty figure (one bucket, one column) cut its title off at both edges."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    title = ("Per difficulty bucket (mean over seeds, 95% CI band: t over seeds; evaluation curves marked at "
             "each evaluation)")
    fig, axes = plot_panels([("t", "y", _curves(["a", "b"]))] * n_panels, arm_colors(["a", "b"]), title=title)
    from matplotlib.text import Text

    canvas = FigureCanvasAgg(fig)
    sup = [t for t in fig.findobj(Text) if t.get_text().replace("\n", " ") == title]
    assert len(sup) == 1  # wrapped, not shortened
    box = sup[0].get_window_extent(canvas.get_renderer())
    assert 0 <= box.x0 and box.x1 <= fig.get_figwidth() * fig.dpi  # inside the figure, left and right
    top_of_panels = max(ax.get_window_extent().y1 for ax in axes.flat if ax.get_visible())
    assert box.y0 > top_of_panels  # above the panels (and their titles' baseline), not over them
    assert box.y1 <= fig.get_figheight() * fig.dpi
