"""Issue 22 defect 14 in-process: a click that brings the graph forward (a kept node in Repair) asks the graph's
front end to scroll it into view (``scroll_into_view`` counts the requests); a tab the user picks does not. The
browser side is tests/test_browser_reveal.py."""

from __future__ import annotations

import pytest
from conftest import SAMPLES

pytest.importorskip("anywidget")

from workbench.ui import Workbench  # noqa: E402

CLAMP = SAMPLES / "fp16_clamp_constant.onnx"
CULPRIT = "/bn_big_var/BatchNormalization"


def test_selecting_a_kept_node_switches_to_the_graph_and_scrolls_it_into_view():
    wb = Workbench(CLAMP)
    wb.show("repair")
    wb.repair_panel.select(CULPRIT)  # what its kept-node button does
    graph = wb.graph_panel
    assert wb.tabs.selected_index == 3 and graph.canvas.selected == CULPRIT
    assert graph.canvas.scroll_into_view == 1
    wb.repair_panel.select(CULPRIT)  # again: a new request, though the graph is already forward
    assert graph.canvas.scroll_into_view == 2
    wb.tabs.selected_index = 0
    wb.tabs.selected_index = 3  # the user's own tab click: the page stays where the user has it
    assert graph.canvas.scroll_into_view == 2


def test_the_orange_rings_say_what_they_mark_in_the_graph_legend():
    """Defect 15: the rings of the kept nodes have a legend entry (the front end draws ``highlight_label`` next to
    an orange ring swatch, tests/test_browser_reveal.py); a search's rings say they are matches."""
    wb = Workbench(CLAMP)
    graph = wb.graph_panel
    assert graph.canvas.highlight == [] and graph.canvas.highlight_label == ""
    wb.repair_panel.run()
    assert wb.repair_panel.wait(120) and wb.repair_panel.kept == [CULPRIT]
    assert CULPRIT in graph.canvas.highlight and graph.canvas.highlight_label == \
        "repaired (rewritten or kept in reference precision)"
    graph.find("Relu")
    assert graph.canvas.highlight and graph.canvas.highlight_label == "search match"


def test_a_culprit_click_switches_to_errors_and_scrolls_to_its_top():
    """A culprit's button in Compare brings Errors forward: the anchor at the top of its tab scrolls into view."""
    from workbench.ui.reveal import RevealAnchor

    wb = Workbench(CLAMP)
    compare = wb.show("compare")
    compare.show_culprit(CULPRIT)  # what a culprit's button does
    assert wb.tabs.selected_index == 2 and wb.state.selected == CULPRIT
    anchor = wb.tabs.children[2].children[0]
    assert isinstance(anchor, RevealAnchor) and wb.tabs.children[2].children[1] is wb.errors_panel
    assert anchor.count == 1
    wb.tabs.selected_index = 1
    wb.tabs.selected_index = 2  # the user's own tab click: no scroll
    assert anchor.count == 1
