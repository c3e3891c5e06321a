"""``run --save-models --tensorboard``: the weights kept, checked, loaded and used on new input;
the TensorBoard events read back with TensorBoard's own reader.

One tiny g2p run from the command line (``cli.main``, in this process), shared by the module.
"""
from __future__ import annotations

import hashlib
import json

import pytest
import torch

from harness import cli

pytestmark = pytest.mark.xdist_group("g2p")  # the g2p lexicon is loaded once per worker

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

UNSEEN = "blorft"  # not a CMUdict word: in neither split


@pytest.fixture(scope="module")
def g2p_run(tmp_path_factory):
    """``run --variants baseline --task g2p --preset tiny --save-models --tensorboard DIR`` (150 steps:
    enough for greedy decoding to emit phonemes before the end symbol)."""
    root = tmp_path_factory.mktemp("saved")
    code = cli.main(["run", "--variants", "baseline", "--task", "g2p", "--preset", "tiny", "--set", "train.steps=150",
                     "--set", "train.eval_every=75", "--save-models", "--tensorboard", str(root / "tb"),
                     "--results-dir", str(root), "--run-id", "g", "--no-check", "--device", "cpu", "--jobs", "1",
                     "--threads", "1", "-q"])
    assert code == 0
    return root


def test_tensorboard_events_hold_the_curves_and_hparams(g2p_run):
    ea = EventAccumulator(str(g2p_run / "tb" / "g" / "baseline__s0"))
    ea.Reload()
    scalars = set(ea.Tags()["scalars"])
    assert {"train/loss", "train/learning_rate", "dev/ce", "dev/exact_match", "dev/wer",
            "dev/per", "final/heldout_ce", "final/wer"} <= scalars
    curve = json.loads((g2p_run / "g" / "trials" / "baseline__s0.json").read_text())["curve"]
    train = [p for p in curve if p["split"] == "train"]
    loss = ea.Scalars("train/loss")
    assert [e.step for e in loss] == [p["step"] for p in train]
    assert [e.value for e in loss] == pytest.approx([p["loss"] for p in train], rel=1e-6)
    heldout = [p for p in curve if p["split"] == "dev"]
    assert [e.value for e in ea.Scalars("dev/wer")] == pytest.approx([p["wer"] for p in heldout], rel=1e-6)
    lr = ea.Scalars("train/learning_rate")
    assert lr[0].value < lr[-1].value  # the Noam warm-up: the rate rises over the first steps
    norms = ea.Scalars("train/grad_norm")  # the mean gradient norm (before clipping) of each curve row
    assert [e.value for e in norms] == pytest.approx([p["grad_norm"] for p in train], rel=1e-6)
    assert all(e.value > 0 for e in norms) and "notes/text_summary" not in ea.Tags()["tensors"]
    # hparams: the plugin's session-start summary names the variant, seed and the config's fields
    hp = ea.PluginTagToContent("hparams")
    start = next(v for k, v in hp.items() if "session_start" in k)
    assert b"baseline" in start and b"model.d_model" in start and b"train.steps" in start


def test_report_exports_a_finished_run(g2p_run, capsys):
    assert cli.main(["report", str(g2p_run / "g"), "--tensorboard", "-q"]) == 0
    assert "tensorboard: 1 trial(s)" in capsys.readouterr().out
    ea = EventAccumulator(str(g2p_run / "g" / "tensorboard" / "baseline__s0"))
    ea.Reload()
    assert len(ea.Scalars("train/loss")) == 150


def test_decode_pronounces_a_word_it_never_saw(g2p_run, capsys):
    from harness.tasks.g2p import LETTER_LOW, LETTERS, lexicon

    lex = lexicon()
    assert tuple(LETTER_LOW + LETTERS.index(c) for c in UNSEEN) not in lex.refs  # in neither split
    for extra in ([], ["--beam", "2"]):
        assert cli.main(["decode", str(g2p_run / "g"), "--variant", "baseline", "--seed", "0", UNSEEN,
                         *extra]) == 0
        word, phones = capsys.readouterr().out.rstrip("\n").split("\t")
        assert word == UNSEEN and phones.split(), phones
        assert set(phones.split()) <= set(lex.phones)  # ARPAbet symbols, no stress marks
    assert cli.main(["decode", str(g2p_run / "g"), "bl0rft"]) == 2
    assert "not a letter: '0'" in capsys.readouterr().err


def test_load_model_rebuilds_the_trained_module(g2p_run):
    import harness

    model = harness.load_model(g2p_run / "g", "baseline", seed=0)
    stored = torch.load(g2p_run / "g" / "models" / "baseline__s0.pt", weights_only=True)
    assert not model.training and set(model.state_dict()) == set(stored)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in stored.items())
    fresh = harness.build_model("baseline", json.loads((g2p_run / "g" / "config.json").read_text())["config"]["model"])
    assert any(not torch.equal(fresh.state_dict()[k], v) for k, v in stored.items())  # trained, not initial
    with pytest.raises(harness.HarnessError, match="no trial 'baseline__s7'"):
        harness.load_model(g2p_run / "g", "baseline", seed=7)


def test_verify_checks_the_saved_weights(g2p_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "g"
    shutil.copytree(g2p_run / "g", run)
    record = json.loads((run / "trials" / "baseline__s0.json").read_text())["model"]
    data = (run / record["file"]).read_bytes()
    assert record["sha256"] == hashlib.sha256(data).hexdigest() and record["bytes"] == len(data)
    assert cli.main(["verify", str(run)]) == 0
    (run / record["file"]).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # one bit flipped
    capsys.readouterr()
    assert cli.main(["verify", str(run)]) == 1
    assert "models/baseline__s0.pt: checksum mismatch" in capsys.readouterr().out
    with pytest.raises(Exception, match="checksum mismatch"):
        import harness

        harness.load_model(run, "baseline", seed=0)


def test_a_model_record_cannot_point_outside_the_run(tmp_path):
    from harness.verification import model_problems

    (tmp_path / "secret.pt").write_bytes(b"x")
    from harness.trial import TrialResult

    forged = TrialResult({"variant": "baseline", "seed": 0, "status": "ok"},
                         extra={"model": {"file": "../secret.pt", "sha256": hashlib.sha256(b"x").hexdigest()}})
    assert model_problems(tmp_path / "run", [forged]) == [
        "trials/baseline__s0.json: its model file is '../secret.pt', not models/baseline__s0.pt"]
