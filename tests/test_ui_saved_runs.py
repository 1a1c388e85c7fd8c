"""Runs that survive a kernel restart (issue 22): every finished comparison, calibration, repair and dataset run
is saved as a bundle into the per-user runs folder (``$WORKBENCH_RUNS_DIR``; the newest ``$WORKBENCH_RUNS_KEEP``
kept, written atomically); a fresh Workbench on the same model lists them and reopens one into the run state, so
every view shows it as ``run #N, reopened from BUNDLE``. Driven in-process on real engines; a fresh Workbench on a
fresh state stands for the kernel restart (tests/test_browser_saved_runs.py restarts a real kernel)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SAMPLES

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from workbench.ui import Workbench, run_store  # noqa: E402

CLAMP = SAMPLES / "fp16_clamp_constant.onnx"
CULPRIT = "/bn_big_var/BatchNormalization"


@pytest.fixture
def runs(tmp_path, monkeypatch):
    folder = tmp_path / "runs"
    monkeypatch.setenv(run_store.RUNS_ENV, str(folder))
    monkeypatch.delenv(run_store.KEEP_ENV, raising=False)
    return folder


def _metrics(result) -> dict:
    return {t.tensor: t.metrics for t in result.tensors}


def test_runs_dir_is_the_users_cache_never_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(run_store.RUNS_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert run_store.runs_dir() == tmp_path / "cache" / "onnx-drift-workbench" / "runs"
    monkeypatch.setenv(run_store.RUNS_ENV, str(tmp_path / "mine"))
    assert run_store.runs_dir() == tmp_path / "mine"


def test_a_comparison_is_saved_and_reopened_after_a_restart_in_every_view(runs):
    wb = Workbench(CLAMP)
    assert "no saved runs of this model yet" in wb.saved_runs.title.value
    panel = wb.compare_panel
    assert panel.run() is not None and panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value
    original = wb.state.result
    assert run_store.wait_saved(60)
    [entry] = [p for p in runs.iterdir()]
    assert (entry / "run.json").is_file() and (entry / "bundle" / "manifest.json").is_file()
    assert list((entry / "bundle").glob("model/*.onnx"))  # a small model is copied into the bundle
    assert not [p for p in runs.iterdir() if p.name.endswith(".tmp")]  # built aside, renamed into place
    assert wb.saved_runs.saved and wb.saved_runs.saved[0].path == entry  # the live Workbench lists it at once

    fresh = Workbench(CLAMP)  # a new kernel: nothing in memory
    assert fresh.state.result is None and fresh.state.runs is None
    [saved] = fresh.saved_runs.saved
    assert saved.kind == "comparison" and saved.run_id == 1 and saved.summary == "DIVERGED"
    assert "run #1 comparison" in fresh.saved_runs.picker.options[0][0]
    fresh.saved_runs.reopen_button.click()
    result = fresh.state.result
    assert result is not None and result is not original
    assert _metrics(result) == _metrics(original) and result.diverged == original.diverged
    assert [c.node for c in result.culprits] == [c.node for c in original.culprits]
    run = fresh.state.current_run("comparison")
    # numbered after the saved run #1: a restart does not start again at #1 (two runs #1 in the saved list)
    assert run.result is result and run.label == saved.label and run.tag == f"run #2, reopened from {entry.name}"
    assert run.tag in fresh.saved_runs.note.value
    # every view derives from it
    assert f"{run.tag}:" in fresh.errors_panel.message.value and fresh.errors_panel.curve_shown
    assert run.tag in fresh.compare_panel.summary.value
    assert any(CULPRIT in b.description for row in fresh.compare_panel.culprit_rows.children[1:]
               for b in getattr(row, "children", ()) if hasattr(b, "description"))
    fresh.graph_panel.select(CULPRIT)
    t = next(t for t in original.tensors if t.node == CULPRIT)
    assert f"from comparison {run.tag}" in fresh.graph_panel.info.value
    assert f"{t.metrics['sqnr_db']:.4g}" in fresh.graph_panel.info.value
    fresh.errors_panel.select(CULPRIT)  # the layer values rerun both engines on the bundle's own feeds
    assert fresh.errors_panel.wait(120) and fresh.errors_panel.values_plot.outputs
    assert fresh.compare_panel.run() is not None and fresh.compare_panel.wait(120)  # a new run: the note goes
    assert fresh.saved_runs.note.value == "" and "reopened" not in fresh.errors_panel.message.value
    # the run just saved is selected (the previous kernel's stayed selected: Reopen opened an old run), unless the
    # user chose one, which stays chosen while it is listed
    assert run_store.wait_saved(60)
    picker = fresh.saved_runs.picker
    assert len(picker.options) == 2 and picker.value == picker.options[0][1] != str(entry)
    picker.value = str(entry)
    assert fresh.compare_panel.run() is not None and fresh.compare_panel.wait(120) and run_store.wait_saved(60)
    assert len(picker.options) == 3 and picker.value == str(entry)


def test_only_the_newest_runs_are_kept(runs, monkeypatch):
    monkeypatch.setenv(run_store.KEEP_ENV, "2")
    wb = Workbench(CLAMP)
    for _ in range(3):
        assert wb.compare_panel.run() is not None and wb.compare_panel.wait(120)
        assert run_store.wait_saved(60)
    kept = run_store.saved_runs()
    assert [r.run_id for r in kept] == [3, 2] and len(list(runs.iterdir())) == 2
    monkeypatch.setenv(run_store.KEEP_ENV, "0")  # saving off
    assert wb.compare_panel.run() is not None and wb.compare_panel.wait(120) and run_store.wait_saved(60)
    assert [r.run_id for r in run_store.saved_runs()] == [3, 2]


def test_a_large_model_is_referenced_not_copied(runs, monkeypatch):
    monkeypatch.setenv(run_store.COPY_ENV, "0.001")  # 1 kB: the sample is over it
    wb = Workbench(CLAMP)
    assert wb.compare_panel.run() is not None and wb.compare_panel.wait(120) and run_store.wait_saved(60)
    [saved] = run_store.saved_runs()
    assert not list(saved.bundle.glob("model/*.onnx"))  # the bundle names the model by path and sha256
    fresh = Workbench(CLAMP)
    assert fresh.reopen(saved) is not None and _metrics(fresh.state.result) == _metrics(wb.state.result)


def test_other_models_runs_are_not_listed_and_a_damaged_bundle_is_a_message(runs):
    wb = Workbench(CLAMP)
    assert wb.compare_panel.run() is not None and wb.compare_panel.wait(120) and run_store.wait_saved(60)
    assert Workbench(SAMPLES / "healthy_cnn.onnx").saved_runs.saved == []  # another model's runs are not its
    [saved] = run_store.saved_runs()
    results = saved.bundle / "results.json"
    results.write_text(results.read_text().replace('"diverged": true', '"diverged": false', 1))
    fresh = Workbench(CLAMP)
    assert fresh.reopen(fresh.saved_runs.saved[0]) is None
    assert "changed since the bundle was written" in fresh.saved_runs.note.value
    assert fresh.state.result is None


def test_calibration_dataset_and_repair_runs_are_reopened(runs, tmp_path):
    wb = Workbench(CLAMP)
    cal = wb.calibration_panel
    cal.data_count.value, cal.eval_count.value = 2, 2
    cal.run()
    assert cal.wait(120) and wb.state.calibration is not None, cal.jobs.status.value
    folder = tmp_path / "npz"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        np.savez(folder / f"s{i}.npz", image=rng.standard_normal((1, 4, 16, 16)).astype(np.float32))
    data = wb.dataset_panel
    data.folder.value = str(folder)
    data.metrics.value, data.task_target.value = ("top1",), "mean top1>=0.5"  # the target is saved and reopened
    data.run()
    assert data.wait(180) and data.jobs.error is None, data.jobs.status.value
    repair = wb.repair_panel
    repair.max_builds.value = 4
    repair.run()
    assert repair.wait(240) and repair.jobs.error is None, repair.jobs.status.value
    assert run_store.wait_saved(120)
    originals = {"calibration": wb.state.calibration, "dataset": data.result, "repair": repair.result}
    kinds = {r.kind: r for r in run_store.saved_runs(wb.state.model.fingerprint)}
    assert set(kinds) == {"calibration", "dataset", "repair"}, kinds

    fresh = Workbench(CLAMP)
    for kind in ("calibration", "dataset", "repair"):
        run = fresh.reopen(kinds[kind])
        assert run is not None, fresh.saved_runs.note.value
        assert f"run #{run.id}, reopened from {kinds[kind].path.name}" in fresh.saved_runs.note.value
        assert fresh.state.current_run(kind) is run
    report, original = fresh.state.calibration, originals["calibration"]
    assert report.to_json() == original.to_json()
    assert fresh.state.current_run("calibration").tag in fresh.calibration_panel.summary.value
    assert fresh.calibration_panel.sensitivity.outputs and "<table" in fresh.calibration_panel.represent.value
    assert fresh.dataset_panel.result.to_json() == originals["dataset"].to_json()
    assert fresh.dataset_panel.result.verdict() == originals["dataset"].verdict()
    assert originals["dataset"].to_json()["task_target"]["text"] == "mean top1>=0.5"
    assert fresh.state.current_run("dataset").tag in fresh.dataset_panel.summary.value
    assert fresh.repair_panel.result.to_json() == originals["repair"].to_json() | {
        "bundle": fresh.repair_panel.result.bundle}
    assert fresh.state.current_run("repair").tag in fresh.repair_panel.summary.value
    # a reopened run keeps its numbers, not its readers: its worst sample and its QDQ export say so in one line
    worst = fresh.dataset_panel.result.samples[0]["index"]
    assert fresh.dataset_panel.open_sample(worst) is None
    assert "reopened from disk" in fresh.dataset_panel.sample_note.value
    cal = fresh.calibration_panel
    assert cal.qdq_button.disabled and "Calibrate again to save its QDQ model" in cal.export_note.value
    assert not cal.cache_button.disabled and cal.export_cache() is not None  # the ranges suffice for the cache
    assert "TensorRT cache written" in cal.export_note.value and "wb-download" in cal.export_note.value


def test_reopen_sets_the_pickers_and_inputs_so_run_compares_the_same_again(runs):
    """After a restart, Reopen showed the saved run but left the pickers and the inputs as the new kernel had them:
    Run then compared something else (on a model with dynamic dimensions it failed on the unfilled shapes)."""
    wb = Workbench(CLAMP)
    panel = wb.compare_panel
    panel.cand_variant.value = "int8"
    panel.inputs.seed.value, panel.inputs.count.value = 5, 2
    assert panel.run() is not None and panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value
    original = wb.state.result
    assert run_store.wait_saved(60)

    fresh = Workbench(CLAMP)
    box = fresh.compare_panel
    assert (box.candidate, box.inputs.seed.value, box.inputs.count.value) == ("ort:fp16", 0, 1)
    fresh.saved_runs.reopen_button.click()
    assert (box.reference, box.candidate) == ("ort", "ort:int8")
    assert (box.inputs.source.value, box.inputs.seed.value, box.inputs.count.value) == ("random", 5, 2)
    assert box.stale_note.value == ""  # the pickers say what the results shown ran
    assert box.run() is not None and box.wait(120) and box.jobs.error is None, box.jobs.status.value
    again = fresh.state.result
    assert again.candidate == "ort:int8" and again.feeds["seed"] == 5 and again.feeds["count"] == 2
    assert _metrics(again) == _metrics(original) and again.diverged == original.diverged
