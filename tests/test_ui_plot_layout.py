"""Issue 22 defects 15 and 17 on the figure objects: the culprit chart's legend sits above the plot (below it,
it overlapped the x-axis title); the inventory's counts read horizontally; the dataset plots share the other
plots' template and title style."""

from __future__ import annotations

import numpy as np
from conftest import SAMPLES

from workbench.compare.api import compare
from workbench.dataset import compare_dataset
from workbench.inspection import inspect_model
from workbench.plots import TITLE_CHARS, wrap_text
from workbench.plots.compare import LEGEND_ROOM, culprit_bars
from workbench.plots.dataset import first_divergence_bars, layer_spread, sample_metric
from workbench.plots.inventory import inventory_bar

CLAMP = SAMPLES / "fp16_clamp_constant.onnx"


def test_the_culprit_chart_legend_is_a_row_above_the_plot_clear_of_the_axis_title():
    result = compare(CLAMP, "ort", "ort:fp16")
    assert result.culprits
    fig = culprit_bars(result)
    layout = fig.layout
    legend = layout.legend
    assert legend.orientation == "h" and legend.yanchor == "bottom" and legend.y >= 1.0  # above the plot area
    assert layout.xaxis.title.text and layout.xaxis.side in (None, "bottom")  # the axis title stays below it
    # the top margin holds the title's lines and, under them, the legend's rows
    lines = len(wrap_text(layout.title.text.replace("<br>", " "), TITLE_CHARS))
    assert layout.margin.t >= 30 + 19 * lines + LEGEND_ROOM
    # the tolerance line's label is at the plot's bottom, not on the legend's row
    label = next(a for a in layout.annotations if a.text == "tolerance")
    assert label.y == 0 and label.yanchor == "bottom"


def test_inventory_counts_read_horizontally_with_room_for_them():
    fig = inventory_bar(inspect_model(SAMPLES / "transformer_block.onnx"))
    counts = [c for trace in fig.data for c in trace.x]
    for trace in fig.data:
        assert trace.orientation == "h" and trace.textposition == "outside" and trace.textangle == 0
    assert fig.layout.xaxis.range[1] >= 1.1 * max(counts)
    assert fig.layout.yaxis.automargin


def test_dataset_plots_share_the_other_plots_style(tmp_path):
    for i in range(4):
        rng = np.random.default_rng(i)
        np.savez(tmp_path / f"s{i}.npz", image=(rng.standard_normal((1, 4, 16, 16)) * (0.2 + i)).astype(np.float32))
    result = compare_dataset(CLAMP, "ort", "ref:fp16", str(tmp_path))
    style = inventory_bar(inspect_model(CLAMP)).layout
    figures = [layer_spread(result), sample_metric(result), first_divergence_bars(result)]
    for fig in figures:
        assert fig.layout.template == style.template, fig.layout.title.text
        assert (fig.layout.title.x, fig.layout.title.xanchor, fig.layout.title.font.size) == \
            (style.title.x, style.title.xanchor, style.title.font.size)


