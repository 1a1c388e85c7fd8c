"""Issue 22 defects 10, 15 and 17 on the figure objects: a long per-layer curve's axis ends at its last layer, its
ticks are thinned, its legend is clear of the range slider, which is transparent in either theme; the culprit
chart's legend sits above the plot (below it, it overlapped the x-axis title); the inventory's counts read
horizontally; the dataset plots share the other plots' template and title style."""

from __future__ import annotations

import numpy as np
import onnx
from conftest import SAMPLES
from onnx import TensorProto, helper, numpy_helper

from workbench.compare.api import compare
from workbench.dataset import compare_dataset
from workbench.inspection import inspect_model
from workbench.plots import TITLE_CHARS, wrap_text
from workbench.plots.compare import CURVE_TICKS, LEGEND_ROOM, ZOOM_LAYERS, culprit_bars, layer_error_curve
from workbench.plots.dataset import first_divergence_bars, layer_spread, sample_metric
from workbench.plots.inventory import inventory_bar

CLAMP = SAMPLES / "fp16_clamp_constant.onnx"


def _chain(path, nodes: int) -> None:
    """x[1,16] -> (Mul, Add) pairs -> y: ``nodes`` nodes in a row, every tensor named."""
    rng = np.random.default_rng(0)
    body, inits, prev = [], [], "x"
    for k in range(nodes // 2):
        inits += [numpy_helper.from_array(rng.uniform(0.9, 1.1, 16).astype(np.float32), f"m{k}"),
                  numpy_helper.from_array(rng.uniform(-0.1, 0.1, 16).astype(np.float32), f"a{k}")]
        body += [helper.make_node("Mul", [prev, f"m{k}"], [f"t{k}"], name=f"/block{k}/Mul"),
                 helper.make_node("Add", [f"t{k}", f"a{k}"], [f"u{k}"], name=f"/block{k}/Add")]
        prev = f"u{k}"
    graph = helper.make_graph(body, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def test_a_526_layer_curve_ends_at_its_last_layer_with_its_legend_clear_of_a_transparent_slider(tmp_path):
    path = tmp_path / "chain526.onnx"
    _chain(path, 526)
    result = compare(path, "ort", "ort:fp16", culprits=False)
    xs = sorted(t.topo_index for t in result.tensors)
    assert len(xs) >= ZOOM_LAYERS and len(xs) >= 500
    fig = layer_error_curve(result)
    layout = fig.layout
    axis = layout.xaxis
    # the axis (autoranged or reset by "all") is bounded by the first and last layer, a layer or 1 % of padding
    pad = max(1.0, 0.01 * (xs[-1] - xs[0]))
    assert axis.autorangeoptions.maxallowed == xs[-1] + pad and axis.autorangeoptions.minallowed == xs[0] - pad
    assert xs[-1] < axis.autorangeoptions.maxallowed <= xs[-1] + 0.02 * len(xs)
    assert axis.nticks == CURVE_TICKS and CURVE_TICKS <= 15 and axis.automargin
    # the slider: visible, spanning the layers only, transparent with a visible border in light and dark themes
    slider = axis.rangeslider
    assert slider.visible and list(slider.range) == [xs[0] - pad, xs[-1] + pad] and slider.autorange is False
    assert slider.bgcolor.replace(" ", "").endswith(",0)") and slider.borderwidth >= 1
    # the legend is a column right of the plot: clear of the slider (under the x axis) and of the title's lines
    legend = layout.legend
    assert legend.orientation == "v" and legend.x > 1.0 and legend.xanchor == "left"
    lines = len(wrap_text(layout.title.text.replace("<br>", " "), TITLE_CHARS))
    assert layout.margin.t >= 30 + 19 * lines
    # no annotation of the figure's own sits in the legend's row
    for a in layout.annotations:
        if a.yref == "paper" and a.name == "curve notes":
            assert a.y <= 1 and a.yanchor == "top"


def test_a_short_curve_keeps_its_bounded_axis_and_no_slider():
    result = compare(CLAMP, "ort", "ort:fp16")
    layout = layer_error_curve(result).layout
    xs = [t.topo_index for t in result.tensors]
    assert not layout.xaxis.rangeslider.visible
    assert layout.xaxis.autorangeoptions.maxallowed > max(xs) and layout.xaxis.autorangeoptions.minallowed < min(xs)
    # INT8's colour bands add legend entries (a group stacks its own): below the plot they climbed onto the axis
    # title and tick labels, above it onto the title; in a column right of the plot they meet neither
    from workbench.plots.thresholds import Bands

    int8 = compare(CLAMP, "ort", "ort:int8")
    banded = layer_error_curve(int8, bands=Bands.from_criterion(int8.criterion)).layout
    for lay in (layout, banded):
        assert lay.legend.orientation == "v" and lay.legend.x > 1.0 and lay.legend.yanchor == "top"
        lines = len(wrap_text(lay.title.text.replace("<br>", " "), TITLE_CHARS))
        assert lay.margin.t >= 30 + 19 * lines
    assert banded.yaxis.title.text.startswith("norm_mean_abs<br>(")  # the long axis title on two lines


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




def test_the_worst_layers_labels_stack_in_the_layers_order_so_their_arrows_do_not_cross():
    """Neighbouring worst layers (#1-#3 within a few layers of each other on a recognizer) had their labels
    offset by rank, not by position: the arrows crossed and the labels sat on each other's arrows."""
    int8 = compare(CLAMP, "ort", "ort:int8")
    labels = [a for a in layer_error_curve(int8).layout.annotations if a.name == "worst layer"]
    assert len(labels) >= 2
    by_x = sorted(labels, key=lambda a: a.x)
    assert [a.ay for a in by_x] == sorted(a.ay for a in by_x) and len({a.ay for a in by_x}) == len(by_x)
    assert len({a.ax for a in labels}) == 1 and all(a.xanchor == "right" for a in labels)
    assert sorted(a.text.split(":")[0] for a in labels) == [f"worst #{k}" for k in range(1, len(labels) + 1)]
