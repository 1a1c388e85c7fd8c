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
