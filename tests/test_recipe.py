"""The training recipe as named choices (:mod:`harness.schedule`, :mod:`harness.recipe`, the recipe keys of
:class:`harness.config.TrainConfig`): each schedule's learning rate at its key steps against its formula and
against what ``LambdaLR`` sets, AdamW's no-decay rule and what one step does to each parameter, the settings
table, and a run stored when ``train.lr`` named the Noam factor, read, verified, reported and resumed."""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
import subprocess
import sys

import pytest
import torch

from harness import cli
from harness.config import OPTIMIZERS, ModelConfig, RunConfig, TrainConfig, get_preset
from harness.model import build_model
from harness.recipe import decayed_names, make_optimizer
from harness.schedule import SCHEDULES, lr_at, peak_lr
from harness.settings import field_docs, setting_rows
from harness.store import RunStore
from harness.tboard import learning_rate

from .conftest import ROOT

LR, LOW = 1e-3, 1e-5


def _train(**kw) -> TrainConfig:
    return TrainConfig(**{"steps": 100, "warmup": 10, **kw}).validate(64)


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_cosine_and_linear_warm_up_to_lr_and_reach_min_lr_at_the_last_step(schedule):
    lr = lr_at(_train(schedule=schedule, lr=LR, min_lr=LOW), 64)
    assert lr(1) == pytest.approx(LR / 10) and lr(5) == pytest.approx(LR * 5 / 10) and lr(10) == LR
    # half-way through the decay (p = 45 / 90) both are half-way between lr and min_lr
    assert lr(55) == pytest.approx(LOW + (LR - LOW) * 0.5, rel=1e-12)
    p = 20 / 90  # a quarter of the way the two shapes differ: 0.5 (1 + cos(pi p)) against 1 - p
    shape = 0.5 * (1 + math.cos(math.pi * p)) if schedule == "cosine" else 1 - p
    assert lr(30) == pytest.approx(LOW + (LR - LOW) * shape, rel=1e-12)
    assert lr(100) == pytest.approx(LOW, rel=1e-12) and lr(99) > LOW
    assert all(lr(t) >= lr(t + 1) for t in range(10, 100))  # no bump after the warm-up


def test_wsd_is_stable_then_decays_linearly_over_the_last_fraction():
    lr = lr_at(_train(schedule="wsd", lr=LR, min_lr=LOW, decay_fraction=0.2), 64)  # decay over steps 81..100
    assert lr(5) == pytest.approx(LR / 2) and lr(10) == lr(50) == lr(80) == LR
    assert lr(90) == pytest.approx(LOW + (LR - LOW) * 0.5, rel=1e-12)
    assert lr(100) == pytest.approx(LOW, rel=1e-12)
    assert lr_at(_train(schedule="wsd", lr=LR), 64)(100) == 0.0  # min_lr 0 (default): decay to zero


def test_noam_and_constant_keep_their_meaning():
    """``noam``: the Annotated ``rate`` with step s = max(t - 1, 1); ``constant`` without ``train.lr``:
    noam_factor * d_model^-0.5 (the stored experiments' meaning), with it: ``train.lr``."""
    noam = _train(noam_factor=0.5)
    lr = lr_at(noam, 64)
    for t in (1, 2, 11, 50, 100):
        s = max(t - 1, 1)
        assert lr(t) == pytest.approx(0.5 * 64 ** -0.5 * min(s ** -0.5, s * 10 ** -1.5), rel=1e-12)
    assert peak_lr(noam, 64) == pytest.approx(0.5 * 64 ** -0.5 * 10 ** -0.5)
    assert lr_at(_train(schedule="constant", noam_factor=0.008), 64)(37) == 0.001  # bitwise: xiong_no_warmup
    assert lr_at(_train(schedule="constant", lr=0.003), 64)(1) == 0.003
    assert set(SCHEDULES) == {"noam", "constant", "cosine", "linear", "wsd"} and set(OPTIMIZERS) == {"adam", "adamw"}


@pytest.mark.parametrize("recipe", [{}, {"train.schedule": "constant"}, {"train.schedule": "cosine", "train.lr": 0.01},
                                    {"train.schedule": "linear", "train.lr": 0.01, "train.min_lr": 0.001},
                                    {"train.schedule": "wsd", "train.lr": 0.01, "train.optimizer": "adamw"}])
def test_lambdalr_the_group_and_the_tensorboard_curve_give_the_same_rate(registry, recipe):
    """The sequential loop's LambdaLR, :func:`lr_at` (the trial group's ``set_lr``) and ``train/learning_rate``
    agree bitwise at every step."""
    cfg = get_preset("tiny").override(recipe)
    model = build_model(registry, registry.variants["baseline"], cfg.model, seed=0)
    opt, sched = make_optimizer(model, cfg)
    lr, curve = lr_at(cfg.train, cfg.model.d_model), learning_rate(cfg.to_dict())
    for t in range(1, cfg.train.steps + 1):
        assert {g["lr"] for g in opt.param_groups} == {lr(t)} == {curve(t)}, t
        opt.step()
        sched.step()


def test_adamw_decays_matrices_but_not_biases_norms_or_embeddings(registry):
    cfg = get_preset("tiny").override({"train.optimizer": "adamw"})
    model = build_model(registry, registry.variants["pre_norm"], cfg.model, seed=0)
    decayed = decayed_names(model, cfg.train)
    names = dict(model.named_parameters())
    assert "embed.generator.weight" in decayed  # the output projection is a matrix, not a lookup table
    assert not {"embed.src_lut.weight", "embed.tgt_lut.weight", "embed.generator.bias"} & decayed
    assert all(names[n].ndim >= 2 for n in decayed)
    norms = [n for n in names if "norm" in n]
    assert norms and not set(norms) & decayed  # pre-norm's final norms and the sub-layer norms
    matrices = {n for n, p in names.items() if p.ndim == 2 and "embed." not in n}
    assert matrices and matrices <= decayed  # every attention and FFN matrix
    assert decayed_names(model, dataclasses.replace(cfg.train, decay_all=True)) == set(names)
    assert decayed_names(model, get_preset("tiny").train) == set()  # adam: no decay
    for variant, table in (("shared_embeddings", "embed.weight"), ("learned_positions", "src_pos.weight")):
        m = build_model(registry, registry.variants[variant], cfg.model, seed=0)
        assert table in dict(m.named_parameters()) and table not in decayed_names(m, cfg.train), variant


def test_one_adamw_step_with_zero_gradients_shrinks_exactly_the_decayed_parameters(registry):
    """Through torch's parameter groups: a zero gradient leaves Adam's update at 0, so one step moves a
    parameter only by its decay, p * (1 - lr * lambda), and leaves every undecayed one as it was."""
    cfg = get_preset("tiny").override({"train.optimizer": "adamw", "train.weight_decay": 0.5,
                                       "train.schedule": "constant", "train.lr": 0.1})
    model = build_model(registry, registry.variants["learned_positions"], cfg.model, seed=0)
    opt, _ = make_optimizer(model, cfg)
    assert type(opt) is torch.optim.AdamW and [g["weight_decay"] for g in opt.param_groups] == [0.5, 0.0]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    decayed = decayed_names(model, cfg.train)
    for n, p in model.named_parameters():
        want = before[n] * (1 - 0.1 * 0.5) if n in decayed else before[n]
        torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=0, msg=n)
    named = dict(model.named_parameters())
    assert {id(p) for p in opt.param_groups[0]["params"]} == {id(named[n]) for n in decayed}


def test_list_settings_has_every_field_with_its_type_default_and_meaning():
    rows = {r["key"]: r for r in setting_rows({"model": ModelConfig, "train": TrainConfig})}
    for section, cls in (("model", ModelConfig), ("train", TrainConfig)):
        for f in cls.__dataclass_fields__.values():
            row = rows.pop(f"{section}.{f.name}")
            assert row["meaning"] and row["type"] and row["default"] == repr(f.default), row
    assert rows == {} and field_docs(TrainConfig)["lr"].startswith("the peak learning rate")
    out = subprocess.run([sys.executable, "-m", "harness", "list", "--settings"], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert "| train.lr " in out and "| train.weight_decay " in out and "| model.d_model " in out
    assert all(len(line) <= 120 for line in out.splitlines()) and "``" not in out


def test_field_docs_reads_an_args_section_and_stops_at_the_next():
    class Doc:
        """Summary.

        Args:
            a, b: shared text
                over two lines.
            c: its own: with a colon.

        Raises:
            d: not a field.
        """
    assert field_docs(Doc) == {"a": "shared text over two lines.", "b": "shared text over two lines.",
                               "c": "its own: with a colon."}


def test_list_names_the_optimisers_and_schedules(capsys):
    assert cli.main(["list"]) == 0
    recipe = capsys.readouterr().out.partition("Training recipe")[2].partition("[plugin NAME]")[0]
    choices = [line.split("|")[2].split()[0] for line in recipe.splitlines() if line.startswith("| train.")]
    assert choices == ["adam", "adamw", "noam", "constant", "cosine", "linear", "wsd"]


def test_a_run_stored_when_lr_named_the_noam_factor_verifies_reports_and_resumes(tmp_path):
    """results/reference/task-sort stores ``train.lr`` = 0.15 with the noam schedule and no noam_factor:
    it reads as noam_factor 0.15 (lr_max 1.9e-3), verifies, reports and resumes (its config hash holds)."""
    run = tmp_path / "ts"
    shutil.copytree(ROOT / "results" / "reference" / "task-sort", run)
    meta = json.loads((run / "config.json").read_text())
    assert meta["config"]["train"]["lr"] == 0.15 and "noam_factor" not in meta["config"]["train"]
    cfg = RunConfig.from_dict(meta["config"])
    assert cfg.train.noam_factor == 0.15 and cfg.train.lr is None and cfg.train.schedule == "noam"
    assert cli.main(["verify", str(run)]) == 0
    before = {p.name: p.read_bytes() for p in (run / "trials").iterdir()}
    (run / "report.md").unlink()
    assert cli.main(["run", "--resume", str(run), "-q"]) == 0  # every trial stored: nothing to train
    assert {p.name: p.read_bytes() for p in (run / "trials").iterdir()} == before
    text = (run / "report.md").read_text()
    assert "optimiser `adam`; schedule `noam`, warmup 100, Noam factor 0.15 -> lr_max = 0.00187" in text
    assert RunStore.open(run).meta().config_hash == meta["config_hash"]
