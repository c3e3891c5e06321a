"""Live tracking (``run --tensorboard``, ``run --mlflow``: :mod:`harness.track`): a running trial's events
are on disk, with the wall times they were logged at, before the trial ends; the live record holds the
same tags and values as the record written from the stored trial; an export keeps a complete live
record and replaces an incomplete one; a vectorised group writes one record per seed; a tracker that
fails costs the trial nothing; ``--mlflow`` logs the same tags, or is refused in one line.

The paused trial runs :func:`harness.train.run_trial` in a thread whose loop waits on an Event once
step ``PAUSE`` is logged; the test reads the events with TensorBoard's own reader meanwhile.
"""
from __future__ import annotations

import dataclasses
import shutil
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from harness import cli
from harness.config import get_preset
from harness.runner import make_specs
from harness.tboard import LIVE_MARK, trial_writer, write_trial

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

STEPS, PAUSE, EVAL = 8, 6, 4  # the trial pauses after step 6 is logged; one periodic evaluation at step 4


def spec_for(registry, track: dict | None, seeds=(0,), steps: int = STEPS):
    cfg = get_preset("tiny").override({"train.steps": steps, "train.eval_every": EVAL})
    specs = make_specs([registry.variants["baseline"]], list(seeds), cfg, "cpu", "fp32", {}, threads=1)
    return [dataclasses.replace(s, track=track) for s in specs]


def read(folder) -> EventAccumulator:
    ea = EventAccumulator(str(folder))
    ea.Reload()
    return ea


@pytest.fixture(scope="module")
def paused(tmp_path_factory):
    """One trial with live TensorBoard events, paused after step PAUSE: what the reader saw then, the
    time the trial was released, and the finished trial."""
    from harness import train
    from harness.registry import Registry

    root = tmp_path_factory.mktemp("live")
    spec = spec_for(Registry.from_plugins(), {"tensorboard": str(root / "tb"), "mlflow": None, "run": "r"})[0]
    reached, release, out = threading.Event(), threading.Event(), {}
    real_log = train.TrainingLoop.log_step

    def log_then_wait(self, step, *args):
        finite = real_log(self, step, *args)
        if step == PAUSE:  # step PAUSE's curve row has gone to the trackers
            reached.set()
            assert release.wait(600)
        return finite

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train.TrainingLoop, "log_step", log_then_wait)
        worker = threading.Thread(target=lambda: out.update(result=train.run_trial(spec)))
        worker.start()
        try:
            assert reached.wait(600), "the trial never reached step PAUSE"
            folder = root / "tb" / spec.key
            during = read(folder)
            seen = {"tags": set(during.Tags()["scalars"]), "loss": during.Scalars("train/loss"),
                    "ce": during.Scalars("dev/ce"), "mark": (folder / LIVE_MARK).exists()}
            released_at = time.time()
        finally:
            release.set()
            worker.join()
    return SimpleNamespace(root=root, folder=folder, spec=spec, seen=seen, released_at=released_at,
                           result=out["result"])


def test_a_running_trial_s_events_are_readable_before_it_ends(paused):
    seen = paused.seen
    assert [e.step for e in seen["loss"]] == list(range(1, PAUSE + 1))
    walls = [e.wall_time for e in seen["loss"]]
    assert all(a < b for a, b in zip(walls, walls[1:])), walls  # each step stamped when it was logged
    assert walls[-1] < paused.released_at
    assert [e.step for e in seen["ce"]] == [EVAL]  # the periodic evaluation, as it happened
    assert {"train/grad_norm", "train/learning_rate"} <= seen["tags"]
    assert not any(t.startswith("final/") for t in seen["tags"]) and not seen["mark"]  # not ended yet


def test_the_finished_live_record_equals_the_stored_trial_s(paused, tmp_path):
    result = paused.result
    assert result.status == "ok", result.reason
    live = read(paused.folder)
    train_rows = [p for p in result.curve if p["split"] == "train"]
    loss = live.Scalars("train/loss")
    assert [e.step for e in loss] == [p["step"] for p in train_rows] == list(range(1, STEPS + 1))
    assert [e.wall_time for e in loss[:PAUSE]] == [e.wall_time for e in paused.seen["loss"]]
    assert (paused.folder / LIVE_MARK).is_file()
    stored = read(write_trial(tmp_path, paused.spec.key, result, paused.spec.config))
    assert set(live.Tags()["scalars"]) == set(stored.Tags()["scalars"])
    assert any(t.startswith("final/") for t in live.Tags()["scalars"])
    for tag in stored.Tags()["scalars"]:
        assert [(e.step, e.value) for e in live.Scalars(tag)] == [(e.step, e.value) for e in stored.Scalars(tag)], tag
    start = next(v for k, v in live.PluginTagToContent("hparams").items() if "session_start" in k)
    assert b"baseline" in start and b"train.steps" in start


def test_an_export_keeps_a_complete_live_record_and_replaces_an_incomplete_one(paused, tmp_path):
    key, spec = paused.spec.key, paused.spec
    shutil.copytree(paused.folder, tmp_path / key)
    write = trial_writer(tmp_path, SimpleNamespace(trials=[spec], config=spec.config))
    before = sorted(p.name for p in (tmp_path / key).iterdir())
    write(key, paused.result)  # complete: left as the run wrote it (no events twice)
    assert sorted(p.name for p in (tmp_path / key).iterdir()) == before
    (tmp_path / key / LIVE_MARK).unlink()  # as a trial stopped before its end leaves it
    write(key, paused.result)
    files = sorted(p.name for p in (tmp_path / key).iterdir())
    assert len(files) == 1 and files != before and LIVE_MARK not in files
    assert len(read(tmp_path / key).Scalars("train/loss")) == STEPS  # once, from the stored curve


def test_a_trial_whose_worker_stopped_keeps_the_curve_it_wrote(registry, tmp_path):
    from harness.track import TensorBoardTracker
    from harness.trial import TrialResult

    spec = spec_for(registry, None)[0]
    tracker = TensorBoardTracker(tmp_path)  # as the worker's tracker: two rows written, then the worker ends
    tracker.start(spec)
    for step, loss in ((1, 2.5), (2, 2.25)):
        tracker.log(step, {"train/loss": loss}, time.time())
    stored = TrialResult.failed(spec, "its worker ended (--trial-timeout)")  # no curve in the stored record
    trial_writer(tmp_path, SimpleNamespace(trials=[spec], config=spec.config))(spec.key, stored)
    ea = read(tmp_path / spec.key)
    assert [(e.step, e.value) for e in ea.Scalars("train/loss")] == [(1, 2.5), (2, 2.25)]
    start = next(v for k, v in ea.PluginTagToContent("hparams").items() if "session_start" in k)
    assert b"failed" in start and b"train.steps" in start
    assert (tmp_path / spec.key / LIVE_MARK).read_text().strip() == "failed"


def test_a_vectorised_group_writes_one_record_per_seed(registry, tmp_path):
    from harness.group import run_group

    specs = spec_for(registry, {"tensorboard": str(tmp_path), "mlflow": None, "run": "r"}, seeds=(0, 1), steps=5)
    results = run_group(specs)
    assert [r.row.get("vectorised") for r in results] == [2, 2], [r.row.get("vectorised_note") for r in results]
    losses = []
    for spec, result in zip(specs, results):
        ea = read(tmp_path / spec.key)
        train_rows = [p for p in result.curve if p["split"] == "train"]
        assert [(e.step, e.value) for e in ea.Scalars("train/loss")] == \
            [(p["step"], pytest.approx(p["loss"], rel=1e-6)) for p in train_rows]
        assert (tmp_path / spec.key / LIVE_MARK).is_file()
        losses.append([e.value for e in ea.Scalars("train/loss")])
    assert losses[0] != losses[1]  # each seed its own curve, not one shared writer


def test_a_tracker_that_fails_costs_the_trial_nothing(registry, tmp_path):
    from harness.errors import HarnessWarning
    from harness.train import run_trial

    (tmp_path / "file").write_text("not a folder")
    spec = spec_for(registry, {"tensorboard": str(tmp_path / "file" / "tb"), "mlflow": None, "run": "r"},
                    steps=3)[0]
    with pytest.warns(HarnessWarning, match=r"TensorBoardTracker of trial baseline__s0 stopped at start"):
        result = run_trial(spec)
    assert result.status == "ok", result.reason
    assert [p["step"] for p in result.curve if p["split"] == "train"] == [1, 2, 3]


def test_mlflow_without_the_package_is_one_line_and_stores_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # importlib.util.find_spec("mlflow") -> None
    argv = ["run", "--variants", "baseline", "--preset", "tiny", "--seeds", "1", "--device", "cpu", "--no-check",
            "--results-dir", str(tmp_path), "--run-id", "m", "-q", "--mlflow"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install -e '.[mlflow]'" in err[0] and "Traceback" not in err[0], err
    assert not (tmp_path / "m").exists()
    assert cli.main(argv[:-1] + ["--executor", "ray", "--mlflow", "http://127.0.0.1:1"]) == 2
    assert "--mlflow logs from the processes that train the trials" in capsys.readouterr().err


def test_mlflow_logs_params_tags_and_every_curve_row(registry, tmp_path):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed (pip install -e '.[mlflow]')")
    from mlflow.tracking import MlflowClient

    from harness.train import run_trial

    uri = "file:" + str(tmp_path / "mlruns")
    spec = spec_for(registry, {"tensorboard": None, "mlflow": uri, "run": "run-1"}, steps=5)[0]
    result = run_trial(spec)
    assert result.status == "ok", result.reason
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("run-1").experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == spec.key and run.info.status == "FINISHED"
    assert {run.data.tags[k] for k in ("variant", "seed", "harness_run")} == {"baseline", "0", "run-1"}
    assert run.data.params["train.steps"] == "5" and "model.d_model" in run.data.params
    history = client.get_metric_history(run.info.run_id, "train/loss")
    train_rows = [p for p in result.curve if p["split"] == "train"]
    assert sorted((m.step, m.value) for m in history) == [(p["step"], pytest.approx(p["loss"])) for p in train_rows]
    assert {"train/learning_rate", "dev/ce", "final/exact_match"} <= set(run.data.metrics)
