"""The Dataset panel (issue 14) without a browser, on real engines (ort against ref:fp16, which emulates FP16
arithmetic): run a folder of .npz samples, check that the tables and figures show the DatasetResult's numbers,
cancel and fail into a cleared "no current result", and click a sample to publish that sample's single comparison
(its feed read again from the dataset) to the shared state. One browser test drives it in JupyterLab."""

from __future__ import annotations

import html
import shutil
import threading

import numpy as np
import pytest
import test_browser_workbench as harness
from conftest import SAMPLES

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from workbench.dataset import compare_dataset, sample_at  # noqa: E402
from workbench.errors import InputError  # noqa: E402
from workbench.ui import Workbench  # noqa: E402
from workbench.ui.dataset_panel import FOLDER, OBJECT, DatasetPanel  # noqa: E402
from workbench.ui.tables import fmt  # noqa: E402

H = harness.H  # benchmarks/bench_ui.py: JupyterLab and Chromium helpers
artifacts, browser_page = harness.artifacts, harness.browser_page  # that module's fixtures, shared
CLAMP = SAMPLES / "fp16_clamp_constant.onnx"  # image (1, 4, 16, 16) -> logits (1, 10); BN variance clamped in FP16
BN = "/bn_big_var/BatchNormalization"
COUNT = 8


def _feed(i: int) -> np.ndarray:
    rng = np.random.default_rng(100 + i)
    return (rng.standard_normal((1, 4, 16, 16)) * (0.2 + 0.5 * i)).astype(np.float32)


def _npz_folder(folder, count: int = COUNT):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        np.savez(folder / f"s{i:02d}.npz", image=_feed(i))
    return folder


def _figure(out) -> dict:
    return out.outputs[0]["data"]["application/vnd.plotly.v1+json"]


def _points(trace, index: int):
    from plotly.callbacks import Points

    k = list(trace.customdata).index(index)
    return Points(point_inds=[k], xs=[trace.x[k]], ys=[trace.y[k]], trace_name=trace.name, trace_index=0)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _npz_folder(tmp_path_factory.mktemp("dataset") / "npz")


@pytest.fixture(scope="module")
def ran(data):
    """A panel that ran the folder with top1 and top-3 metrics."""
    panel = DatasetPanel(CLAMP, candidate="ref:fp16")
    panel.folder.value = str(data)
    panel.metrics.value = ("top1", "topk")
    panel.topk.value = 3
    assert panel.run() is not None
    assert panel.wait(180) and panel.jobs.error is None, panel.jobs.status.value
    return panel


def test_the_run_shows_the_results_numbers(ran, data):
    result = ran.result
    assert result is not None and result.metrics == ["top1", "topk:3"]
    samples = result.samples
    assert [s["source"] for s in samples] == [f"s{i:02d}.npz" for i in range(COUNT)]
    # the panel ran what a direct call runs: the same per-sample numbers
    direct = compare_dataset(CLAMP, "ort", "ref:fp16", str(data), metrics=["top1", "topk:3"])
    assert [s["task"] for s in direct.samples] == [s["task"] for s in samples]
    # verdict and aggregates, against the per-sample rows
    verdict = result.verdict()
    assert verdict["diverged"] and f"on {COUNT} sample(s)" in ran.summary.value
    assert html.escape("DIVERGED: " + verdict["reason"]) in ran.summary.value
    for name in ("top1", "top3"):
        values = [s["task"][name] for s in samples]
        worst = int(np.argmin(values))
        num = '<td class="wb-num">'  # numbers stay on one line (issue 22 defect 16)
        assert (f"<td>{name}</td>{num}{fmt(float(np.mean(values)))}</td>{num}{fmt(min(values))}</td>"
                f"{num}{fmt(max(values))}</td>{num}{fmt(values[worst])}</td><td>#{samples[worst]['index']}</td>"
                ) in ran.task_table.value
    # the worst samples, a button each, in the result's order, with their first divergence
    worst = result.worst()
    assert [b.description for b in ran.worst_buttons] == [f"#{s['index']} {s['source']}" for s in worst]
    assert worst[0]["task"]["top1"] == min(s["task"]["top1"] for s in samples)
    headers = [c.value for c in ran.worst_grid.children[:6]]
    assert headers == ["<b>sample</b>", "<b>top1</b>", "<b>top3</b>", "<b>logits sqnr_db</b>",
                       "<b>first divergence</b>", "<b>its worst layers</b>"]
    rows = [ran.worst_grid.children[k:k + 6] for k in range(6, len(ran.worst_grid.children), 6)]
    assert len(rows) == len(worst)
    for s, cells in zip(worst, rows):
        assert cells[0] is ran.worst_buttons[worst.index(s)]
        assert [c.value for c in cells[1:3]] == [fmt(s["task"]["top1"]), fmt(s["task"]["top3"])]
        assert cells[3].value == f"{s['outputs']['logits']['sqnr_db']:.1f} dB"
        first = s["first_divergent"]
        assert f">{first['tensor']} ({first['op_type']}, #{first['topo_index']}) sqnr_db " in cells[4].value
        assert all(w["tensor"] in cells[5].value for w in s["worst_layers"])
    # each layer across samples: the figure's series are the result's mean / p95 / worst
    spread = _figure(ran.spread)
    series = {t["name"]: t["y"] for t in spread["data"]}
    for key in ("mean", "p95", "worst"):
        assert series[key] == pytest.approx([r[key] for r in result.layers])
    assert BN + "_output_0" in ran.layer_table.value
    # where samples first diverge: the bars count what the result counts
    bars = _figure(ran.bars)["data"][0]
    counted = {r["tensor"]: r["first_divergent_samples"] for r in result.layers if r["first_divergent_samples"]}
    shown = {label.rsplit(" (", 1)[0]: x for label, x in zip(bars["y"], bars["x"])}
    assert shown == counted and sum(counted.values()) == sum(s["first_divergent"] is not None for s in samples)
    # each sample's task metric, one clickable point per sample
    trace = ran.scatter.data[0]
    assert list(trace.customdata) == [s["index"] for s in samples]
    assert list(trace.y) == pytest.approx([s["task"]["top1"] for s in samples])
    ran.scatter_metric.value = "top3"
    assert list(ran.scatter.data[0].y) == pytest.approx([s["task"]["top3"] for s in samples])
    assert ran.scatter_box.children == (ran.scatter,)


def test_clicking_a_point_publishes_that_samples_comparison(ran, data):
    result = ran.result
    row = result.worst()[1]
    index = row["index"]
    trace = ran.scatter.data[0]
    ran._on_point(trace, _points(trace, index), None)  # what a click on the point does
    assert ran.wait(180) and ran.sample_jobs.error is None, ran.sample_jobs.status.value
    single = ran.state.result
    assert ran.opened == index and ran.result is result
    # its feed is the file's content
    expected = np.load(data / row["source"])["image"]
    assert len(single.used_feeds) == 1
    np.testing.assert_array_equal(single.used_feeds[0]["image"], expected)
    # the same engines and criterion give the same output error as that sample's row
    m = result.criterion.metric
    assert single.reference == result.reference and single.candidate == result.candidate
    assert single.criterion.describe() == result.criterion.describe()
    assert single.tensor("logits").metrics[m] == pytest.approx(row["outputs"]["logits"][m], rel=1e-6)
    assert single.first_divergent.tensor == row["first_divergent"]["tensor"]
    assert single.culprits and single.culprits[0].node == BN  # a full comparison: culprits ranked
    assert f"dataset sample #{index}: {row['source']}" in single.notes[-1]
    assert f"sample #{index} ({row['source']}) opened: DIVERGED" in ran.sample_note.value
    assert ran.state.show == "errors"


def test_a_worst_sample_button_opens_it_in_compare_and_errors(data):
    wb = Workbench(CLAMP)
    compare, errors = wb.compare_panel, wb.errors_panel
    panel = DatasetPanel(state=wb.state, candidate="ref:fp16")
    panel.folder.value = str(data)
    panel.run()
    assert panel.wait(180) and panel.jobs.error is None, panel.jobs.status.value
    row = panel.result.worst()[0]  # no task metric: ranked by the outputs' error
    assert "no task metric chosen" in panel.task_table.value
    assert panel.scatter.layout.title.text == "worst output sqnr_db per sample"
    panel.worst_buttons[0].click()
    assert panel.wait(180) and panel.sample_jobs.error is None, panel.sample_jobs.status.value
    np.testing.assert_array_equal(wb.state.result.used_feeds[0]["image"], np.load(data / row["source"])["image"])
    assert f"dataset sample #{row['index']}: {row['source']}" in compare.summary.value
    assert f"first divergent: {row['first_divergent']['node']} (" in compare.summary.value
    assert errors.curve is not None and "DIVERGED" in errors.message.value
    assert wb.tabs.selected_index == 2  # Errors brought forward
    # opening by index (the field and button under the table) does the same for any sample
    panel.sample_index.value = 6
    panel.open_button.click()
    assert panel.wait(180) and panel.opened == 6
    np.testing.assert_array_equal(wb.state.result.used_feeds[0]["image"], _feed(6))


def test_cancel_clears_the_results_and_says_so(data):
    panel = DatasetPanel(CLAMP, candidate="ref:fp16")
    panel.folder.value = str(data)
    panel.run()
    assert panel.wait(180) and panel.result is not None and panel.worst_buttons
    reached, release = threading.Event(), threading.Event()

    def gated():
        for i in range(12):
            if i == 3:
                reached.set()
                assert release.wait(60)
            yield {"image": _feed(i)}

    panel.set_dataset(gated())
    assert panel.source.value == OBJECT and "read once" in panel.object_note.value
    panel.run()
    assert reached.wait(60)
    # a run in progress: the previous result is gone (not shown as if it were this run's), Run is off
    assert panel.result is None and panel.worst_grid.children == () and not panel.spread.outputs
    assert panel.jobs.running and panel.run_button.disabled
    panel.jobs.cancel_button.click()
    release.set()
    assert panel.wait(60)
    assert panel.jobs.cancelled and panel.jobs.error is None and "cancelled" in panel.jobs.status.value
    assert panel.result is None and "cancelled: no current result" in panel.summary.value
    assert not panel.spread.outputs and not panel.bars.outputs and panel.scatter_box.children == ()
    assert panel.results_box.layout.display == "none"
    assert panel.open_button.disabled and panel.open_sample(0) is None
    assert "no dataset result" in panel.sample_note.value
    assert not panel.run_button.disabled
    panel.source.value = FOLDER  # usable again
    panel.run()
    assert panel.wait(180) and panel.result is not None and len(panel.result.samples) == COUNT


def test_a_failing_run_shows_the_workbench_error(tmp_path):
    panel = DatasetPanel(CLAMP)
    panel.folder.value = str(tmp_path / "missing")
    panel.run()
    assert panel.wait(60)
    assert panel.result is None and "failed (the reason is above)" in panel.summary.value
    status = panel.jobs.status.value
    assert "wb-error" in status and "dataset folder not found" in status and "Traceback" not in status


@pytest.mark.parametrize("field, value, said", [
    ("folder", "", "no dataset folder given"),
    ("custom", "bogus", "unknown metric"),
    ("custom", "nosuchmodule_zz:fn", "cannot import metric"),
    ("criterion", "sqnr_db>30", "sqnr_db"),
    ("task_target", "top1>=x", "is not a number"),
    ("task_target", "top1>=1", "needs a task metric"),
])
def test_bad_options_are_said_before_running(data, field, value, said):
    panel = DatasetPanel(CLAMP)
    panel.folder.value = str(data)
    getattr(panel, field).value = value
    assert panel.run() is None and not panel.jobs.running
    assert said in panel.jobs.status.value and "wb-error" in panel.jobs.status.value


@pytest.mark.parametrize("target, fails", [("top1>=0", False), ("top1>=1.5", True)])
def test_a_task_target_leads_the_verdict(data, target, fails):
    """The outputs diverge on this model (the ``ran`` panel says DIVERGED); with a task target the headline is the
    target's, and the outputs' divergence stays in the reason: FAILED (an error) where the target is missed, here on
    every sample (top1 is 0 or 1), a warning where it holds on every sample (top1 >= 0)."""
    panel = DatasetPanel(CLAMP, candidate="ref:fp16")
    panel.folder.value = str(data)
    panel.metrics.value = ("top1",)
    panel.task_target.value = target
    assert panel.run() is not None
    assert panel.wait(180) and panel.jobs.error is None, panel.jobs.status.value
    result = panel.result
    v = result.verdict()
    assert result.diverged and result.failed == fails
    assert v["task_failing_samples"] == (list(range(len(result.samples))) if fails else [])
    assert html.escape(f"{'FAILED' if fails else 'ok'}: task target: ") in panel.summary.value
    assert ("wb-error" if fails else "wb-warn") in panel.summary.value
    assert ("wb-warn" if fails else "wb-error") not in panel.summary.value


def test_object_source_needs_set_dataset():
    panel = DatasetPanel(CLAMP)
    panel.source.value = OBJECT
    assert "panel.set_dataset" in panel.object_note.value
    assert panel.run() is None and "no Python dataset given" in panel.jobs.status.value


def test_choices_become_compare_dataset_arguments(data):
    panel = DatasetPanel(CLAMP)
    panel.metrics.value = ("top1", "topk", "mask_iou", "ctc")
    panel.topk.value, panel.mask_threshold.value = 7, 0.5
    panel.custom.value = "topk:2, mymod:fn"
    assert panel.metric_specs() == ["top1", "topk:7", "ctc", "mask_iou:0.5", "topk:2", "mymod:fn"]
    assert panel.executor_choice() == (None, 1)
    panel.executor.value, panel.workers.value = "processes", 3
    assert panel.executor_choice() == ("processes", 3) and panel.ray_address.layout.display == "none"
    panel.executor.value = "ray"
    assert panel.executor_choice() == ("ray", 3) and panel.ray_address.layout.display == ""
    panel.ray_address.value = " ray://head:10001 "
    assert panel.executor_choice() == ("ray://head:10001", 3)
    panel.executor.value = "serial"
    panel.custom.value = ""
    panel.folder.value, panel.criterion.value, panel.worst_count.value = str(data), "sqnr_db<40", 3
    panel.task_target.value = " mean top1>=0.9 "
    options = panel.run_options()
    assert options["inputs"] == str(data) and options["criterion"] == "sqnr_db<40" and options["worst"] == 3
    assert options["task_target"] == "mean top1>=0.9"
    assert [m.spec for m in options["metrics"]] == ["top1", "topk:7", "ctc", "mask_iou:0.5"]


def test_a_python_list_runs_and_its_samples_open(tmp_path):
    feeds = [{"image": _feed(i)} for i in range(5)]
    panel = DatasetPanel(CLAMP, candidate="ref:fp16", dataset=feeds)
    assert panel.source.value == OBJECT and "a list of 5 sample(s)" in panel.object_note.value
    panel.worst_count.value = 2
    panel.run()
    assert panel.wait(180) and panel.jobs.error is None, panel.jobs.status.value
    assert [s["source"] for s in panel.result.samples] == [f"list[{i}]" for i in range(5)]
    assert len(panel.worst_buttons) == 2 and "a Python list" in panel.summary.value
    panel.open_sample(3)
    assert panel.wait(180) and panel.sample_jobs.error is None, panel.sample_jobs.status.value
    np.testing.assert_array_equal(panel.state.result.used_feeds[0]["image"], feeds[3]["image"])
    feeds[1]["image"] = feeds[1]["image"] * 2  # the user changed the data since the run: refused, not mixed up
    before = panel.state.result
    panel.open_sample(1)
    assert panel.wait(60) and panel.state.result is before
    assert "its content changed since" in panel.sample_jobs.status.value
    assert "opening sample #1 (list[1]) failed" in panel.sample_note.value
    assert panel.open_sample(99) is None and "no sample #99" in panel.sample_note.value


def test_a_generator_runs_once_and_says_its_samples_cannot_reopen():
    panel = DatasetPanel(CLAMP, candidate="ref:fp16")
    panel.set_dataset({"image": _feed(i)} for i in range(3))
    panel.run()
    assert panel.wait(180) and panel.jobs.error is None, panel.jobs.status.value
    panel.open_sample(1)
    assert panel.wait(60) and "already read once" in panel.sample_jobs.status.value
    assert panel.state.result is None


def test_a_dataloader_with_a_preprocess_function(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    images = torch.from_numpy(np.concatenate([_feed(i) for i in range(4)]))
    loader = DataLoader(TensorDataset(images, torch.arange(4)), batch_size=1)
    panel = DatasetPanel(CLAMP, candidate="ref:fp16")
    panel.set_dataset(loader, preprocess=lambda batch: {"image": batch[0].numpy() * 0.5})
    assert panel.preprocess.disabled and "given from the notebook" in panel.preprocess_note.value
    panel.run()
    assert panel.wait(180) and panel.jobs.error is None, panel.jobs.status.value
    panel.open_sample(2)  # a DataLoader is read again up to the sample
    assert panel.wait(180) and panel.sample_jobs.error is None, panel.sample_jobs.status.value
    np.testing.assert_array_equal(panel.state.result.used_feeds[0]["image"], _feed(2) * 0.5)


def test_a_new_model_clears_the_result(data):
    panel = DatasetPanel(CLAMP, candidate="ref:fp16")
    panel.folder.value = str(data)
    panel.run()
    assert panel.wait(180) and panel.result is not None
    panel.state.load(SAMPLES / "healthy_cnn.onnx")
    assert panel.result is None and "the model changed" in panel.summary.value and not panel.worst_buttons


def test_sample_at_reads_one_sample_again(tmp_path, data):
    folder = _npz_folder(tmp_path / "copy", 3)
    from workbench.dataset import open_dataset

    ds = open_dataset(folder, input_names=["image"])
    by_stream = list(ds)
    again = sample_at(ds, 2)
    assert again.source == "s02.npz" and again.sha256 == by_stream[2].sha256
    np.testing.assert_array_equal(again.feed["image"], _feed(2))
    shutil.copy(data / "s05.npz", folder / "s02.npz")  # replaced since: the hash tells
    assert sample_at(ds, 2).sha256 != by_stream[2].sha256
    with pytest.raises(InputError, match="no sample 3"):
        sample_at(ds, 3)
    listed = open_dataset([{"image": _feed(i)} for i in range(3)], input_names=["image"])
    assert sample_at(listed, 1).sha256 == list(listed)[1].sha256
    with pytest.raises(InputError, match="no sample -1"):
        sample_at(listed, -1)


# --- in a real browser --------------------------------------------------------------------------------------------
@pytest.mark.browser
def test_dataset_panel_in_the_browser_opens_a_clicked_sample(browser_page, artifacts):
    lab, page, errors = browser_page
    folder = _npz_folder(lab.root / "notebooks" / "dataset", 6)
    name = lab.write_notebook("dataset.ipynb", [
        "from pathlib import Path\n\nfrom workbench.ui import ErrorsPanel\n"
        "from workbench.ui.dataset_panel import DatasetPanel\n\n"
        'panel = DatasetPanel(Path("../sample_models/fp16_clamp_constant.onnx").resolve(), candidate="ref:fp16")\n'
        f"panel.folder.value = {str(folder)!r}\n"
        'panel.metrics.value = ("top1",)\npanel',
        "ErrorsPanel(state=panel.state)",
    ])
    H.open_notebook(page, lab, name)
    H.run_all(page)
    root = page.locator(".jp-OutputArea-output").filter(has=page.locator(".wb-h", has_text="Task metrics")).first
    root.evaluate("e => e.scrollIntoView({block: 'start'})")
    H.screenshot(page, artifacts, "dataset-00-panel")
    root.locator("button", has_text="Run").first.click()
    root.get_by_text("worst sample(s)").first.wait_for(timeout=120_000)
    assert "DIVERGED: 6 of 6 sample(s)" in root.inner_text()
    root.get_by_text("worst sample(s)").first.evaluate("e => e.scrollIntoView({block: 'start'})")
    H.screenshot(page, artifacts, "dataset-01-worst")
    scatter = root.locator(".js-plotly-plot").filter(has_text="top1 per sample").first
    scatter.wait_for()
    scatter.scroll_into_view_if_needed()
    H.screenshot(page, artifacts, "dataset-02-scatter")
    points = scatter.locator(".scatterlayer .trace").first.locator(".points path")
    assert points.count() == 6
    points.nth(4).click(force=True)
    note = root.get_by_text("sample #4 (s04.npz) opened: DIVERGED")
    note.wait_for(timeout=120_000)
    note.evaluate("e => e.scrollIntoView({block: 'center'})")
    H.screenshot(page, artifacts, "dataset-03-opened")
    # the Errors panel below now shows that sample's layer-wise view
    errors_view = page.get_by_text("Click a point (a layer) to see its values").first
    errors_view.wait_for(timeout=60_000)
    errors_view.evaluate("e => e.scrollIntoView({block: 'start'})")
    H.screenshot(page, artifacts, "dataset-04-errors")
    assert not errors, errors
