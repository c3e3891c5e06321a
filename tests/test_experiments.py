"""Declarative experiments: parsing, errors, lookup, plans, the grad-norm measurement, end to end."""
import math

import pytest
import torch

from harness import cli
from harness import experiments as ex
from harness.errors import UnknownNameError
from harness.model import build_model
from harness.request import RunRequest
from harness.runmeta import RunMeta

from .conftest import ROOT

SHIPPED = sorted(p.stem for p in (ROOT / "experiments").glob("*.toml"))

TINY = """
description = "tiny test experiment"
variants = ["baseline", "pre_norm"]
seeds = 2
preset = "tiny"
{extra}
"""


def write(tmp_path, name, text):
    d = tmp_path / "experiments"
    d.mkdir(exist_ok=True)
    p = d / f"{name}.toml"
    p.write_text(text)
    return p


def args(seeds_given: bool = False, **kw):
    """The run request an experiment is planned from (seeds count only when given)."""
    kw.setdefault("seeds", None)
    if not seeds_given and kw["seeds"] == 1:
        kw["seeds"] = None
    kw["overrides"] = tuple(kw.get("overrides", ()))
    return RunRequest(**kw)


@pytest.mark.parametrize("name", SHIPPED, ids=SHIPPED)
def test_shipped_experiments_load_and_plan(registry, name):
    exp = ex.load_experiment(ex.find_experiment(name))
    assert exp.name == name and exp.description and exp.claims
    plan = ex.plan_from_experiment(name, registry, args())
    assert len(plan.points) == exp.n_points
    assert ex.n_trials(exp, registry) == len(plan.variants) * len(plan.seeds) * len(plan.points)
    assert plan.meta["experiment_spec"]["name"] == name


def test_a_report_says_when_the_run_changed_what_its_experiment_file_sets():
    """sqrt_d_model_scale's claim speaks of the copy task; its sort run (``--set train.task=sort``, stored as
    ``cli_overrides``) must say it changed the file's setting. ``--set seeds=N`` changes only the sample: not named."""
    from harness.experiments.claims import set_on_top_note

    assert set_on_top_note(RunMeta.from_dict({"cli_overrides": []})) == []
    assert set_on_top_note(RunMeta.from_dict({"cli_overrides": ["seeds=4"]})) == []
    said = set_on_top_note(RunMeta.from_dict({"cli_overrides": ["train.task=sort", "seeds=4"]}))
    assert said == ["This run sets train.task=sort on top of the experiment file (--set). The claims' text and the "
                    "setup notes are the file's, written for its own values: read them for this run's."]


def test_sweep_is_a_full_factorial_with_short_and_dotted_keys(tmp_path, registry):
    p = write(tmp_path, "sw", TINY.format(extra='[config]\ntrain.steps = 7\n[sweep]\nnoam_factor = [0.5, 1.0]\n'
                                                '"model.N" = [1, 2, 3]'))
    exp = ex.load_experiment(p)
    points = exp.points()
    assert [n for n, _ in points][:2] == ["noam_factor=0.5,N=1", "noam_factor=0.5,N=2"] and len(points) == 6
    assert {(c.train.noam_factor, c.model.N, c.train.steps) for _, c in points} == \
        {(lr, n, 7) for lr in (0.5, 1.0) for n in (1, 2, 3)}
    plan = ex.plan_from_experiment(str(p), registry, args(overrides=["seeds=3", "train.steps=4"]))
    assert plan.seeds == [0, 1, 2]
    assert all(c.train.steps == 4 for _, c in plan.points)


def test_a_learning_rate_sweep_is_the_peak_lr_of_a_decaying_schedule_and_refused_with_noam(tmp_path):
    """``lr`` in a sweep is ``train.lr``: the peak of ``cosine``; with the preset's ``noam`` schedule every
    point is refused, in one line naming the file and the key, before anything trains."""
    p = write(tmp_path, "lr", TINY.format(extra='[config]\ntrain.schedule = "cosine"\n[sweep]\nlr = [3e-4, 3e-3]'))
    points = ex.load_experiment(p).points()
    assert [(n, c.train.lr, c.train.schedule) for n, c in points] == [("lr=0.0003", 3e-4, "cosine"),
                                                                       ("lr=0.003", 3e-3, "cosine")]
    p = write(tmp_path, "noam", TINY.format(extra="[sweep]\nlr = [3e-4, 3e-3]"))
    with pytest.raises(ex.ExperimentError) as err:
        ex.load_experiment(p)
    assert "noam.toml" in str(err.value) and "sweep.train.lr" in str(err.value) and "noam_factor" in str(err.value)


@pytest.mark.parametrize("body,needle", [
    ('variants = ["baseline"]\nseeds = 2', "missing required key 'description'"),
    (TINY.format(extra="colour = 1"), "key 'colour'"),
    (TINY.replace("seeds = 2", "seeds = 0").format(extra=""), "key 'seeds': expected a positive integer"),
    (TINY.replace('variants = ["baseline", "pre_norm"]', "variants = []").format(extra=""), "key 'variants'"),
    (TINY.format(extra="[sweep]\nlr = 0.5"), "key 'sweep.lr': expected a non-empty list"),
    (TINY.format(extra="[config]\nmodel.width = 3"), "key 'config.model.width'"),
    (TINY.format(extra='[config]\nmodel.d_model = "big"'), "key 'config'"),
    (TINY.format(extra="[sweep]\nN = [0]"), "key 'sweep.model.N' value 0"),
    (TINY.format(extra='kind = "bake"'), "key 'kind': expected one of train, grad_norm_at_init"),
    (TINY.format(extra='metric = "bleu"'), "key 'metric'"),
    (TINY.format(extra="[analysis]\nfail_if_below = { bleu = 1 }"), "key 'analysis.fail_if_below.bleu'"),
    (TINY.format(extra='[[claim]]\ntext = "x"\ncheck = "verdict"\nvariant = "pre_norm"'), "'claim[0].expected' is missing"),
    (TINY.format(extra='[[claim]]\ntext = "x"\ncheck = "guess"'), "key 'claim[0].check'"),
    (TINY.format(extra='kind = "grad_norm_at_init"\n[sweep]\nlr = [1.0]'), "key 'sweep': expected exactly one sweep, over N"),
    ("description = \n", "not valid TOML"),
])
def test_malformed_files_give_one_line_naming_file_and_key(tmp_path, body, needle):
    p = write(tmp_path, "bad", body)
    with pytest.raises(ex.ExperimentError) as err:
        ex.load_experiment(p)
    msg = str(err.value)
    assert "bad.toml" in msg and needle in msg and "\n" not in msg


def test_experiments_command_lists_and_reports_a_broken_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "good", TINY.format(extra="[sweep]\nnoam_factor = [0.5, 1.0]"))
    write(tmp_path, "broken", TINY.format(extra="[sweep]\nlr = 0.5"))
    assert cli.main(["experiments"]) == 2
    out, err = capsys.readouterr()
    assert "good" in out and "tiny test experiment" in out
    assert "good (train: 2 variants x 2 seeds x 2 point(s) = 8 trials)" in out.splitlines()
    assert "    variants: baseline, pre_norm" in out.splitlines()
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "broken.toml" in lines[0] and "sweep.lr" in lines[0]
    assert cli.main(["experiments", "good"]) == 0
    assert "noam_factor=0.5" in capsys.readouterr().out


def test_lookup_prefers_the_current_directory_then_the_repository(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = write(tmp_path, SHIPPED[0], TINY.format(extra=""))
    assert ex.find_experiment(SHIPPED[0]).resolve() == local.resolve()
    assert ex.find_experiment(SHIPPED[1]).resolve() == (ROOT / "experiments" / f"{SHIPPED[1]}.toml").resolve()
    assert ex.find_experiment(str(local)) == local
    with pytest.raises(UnknownNameError, match="unknown experiment"):
        ex.find_experiment("no_such_experiment")
    with pytest.raises(ex.ExperimentError, match="not found"):
        ex.find_experiment(str(tmp_path / "missing.toml"))


def test_unknown_variant_or_baseline_names_the_file(tmp_path, registry):
    p = write(tmp_path, "v", TINY.replace('"pre_norm"', '"pre_nrom"').format(extra=""))
    with pytest.raises(ex.ExperimentError, match=r"v\.toml: key 'variants'.*pre_norm"):
        ex.plan_from_experiment(str(p), registry, args())
    p = write(tmp_path, "b", TINY.format(extra='baseline = "d2l_attention"'))
    with pytest.raises(ex.ExperimentError, match=r"b\.toml: key 'baseline'"):
        ex.plan_from_experiment(str(p), registry, args())


def test_grad_norms_are_per_layer_deterministic_and_positive(registry):
    exp = ex.load_experiment(ex.find_experiment("xiong_grad_norm_at_init"))
    cfg = exp.base_config().override({"model.N": 3, "model.d_model": 16, "model.d_ff": 32, "train.batch": 8})
    g = {}
    for name in ("baseline", "pre_norm"):
        model = build_model(registry, registry.variants[name], cfg.model, seed=1)
        g[name] = ex.measure_grad_norms(model, cfg, 1, 2, "feed_forward.w_2.weight", torch.device("cpu"))
        assert len(g[name]["encoder"]) == len(g[name]["decoder"]) == 3
        assert all(v > 0 and math.isfinite(v) for v in g[name]["encoder"] + g[name]["decoder"])
    model = build_model(registry, registry.variants["baseline"], cfg.model, seed=1)
    again = ex.measure_grad_norms(model, cfg, 1, 2, "feed_forward.w_2.weight", torch.device("cpu"))
    assert again == g["baseline"]
    assert g["baseline"] != g["pre_norm"]
    with pytest.raises(ex.ExperimentError, match="w_9"):
        ex.measure_grad_norms(model, cfg, 1, 1, "feed_forward.w_9.weight", torch.device("cpu"))


def test_grad_norm_experiment_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "gn", """
description = "grad norm smoke"
kind = "grad_norm_at_init"
variants = ["baseline", "pre_norm"]
seeds = 3
preset = "tiny"
[sweep]
N = [1, 2]
[measure]
batches = 2
[[claim]]
text = "post-norm flat"
check = "slope"
variant = "baseline"
within = [-5.0, 5.0]
""")
    assert cli.main(["run", "--experiment", "gn", "-q", "--results-dir", "res", "--run-id", "g", "--device", "cpu"]) == 0
    text = (tmp_path / "res" / "g" / "report.md").read_text()
    assert "## Log-log slopes" in text and "## Claims checked" in text and "**reproduced**: post-norm flat" in text
    assert (tmp_path / "res" / "g" / "grad_norm_vs_depth.png").is_file()
    assert "slope" in capsys.readouterr().out
    # re-rendered from stored data
    (tmp_path / "res" / "g" / "report.md").unlink()
    assert cli.main(["report", "res/g", "-q"]) == 0
    assert "## Log-log slopes" in (tmp_path / "res" / "g" / "report.md").read_text()


def test_train_experiment_end_to_end_with_failure_analysis_and_claims(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "tr", TINY.format(extra="""
[config]
train.steps = 5
[sweep]
noam_factor = [0.5, 1.0]
[analysis]
fail_if_below = { exact_match = 0.5 }
[[claim]]
text = "pre-norm fails less"
check = "failure_rate_greater"
a = "baseline"
b = "pre_norm"
[[claim]]
text = "params"
check = "params_difference"
a = "pre_norm"
b = "baseline"
expected = "4*d_model"
"""))
    assert cli.main(["run", "--experiment", "tr", "-q", "--results-dir", "res", "--run-id", "t", "--device", "cpu",
                     "--set", "train.steps=4"]) == 0
    text = (tmp_path / "res" / "t" / "report.md").read_text()
    assert "## Convergence" in text and "failed x/n [Wilson 95%]" in text and "(all points)" in text
    # --set on a pinned key: the report says the file's wording is read for another value
    assert "This run sets train.steps=4 on top of the experiment file (--set)." in text
    # 4 steps: every run ends below exact-match 0.5, so the failure rates are equal: not reproduced
    assert "**not reproduced**: pre-norm fails less" in text and "baseline 4/4, pre_norm 4/4" in text
    assert "## Where this miniature departs from the paper" in text and "No run diverged" in text
    # pre-norm adds the two final LayerNorms: 2 x (weight + bias) x d_model
    assert "**reproduced**: params" in text
    assert "| noam_factor=0.5 " in text and "## Sweep" in text


def test_grad_norm_experiment_with_a_bad_parameter_is_refused_before_a_folder_exists(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "gn_bad", """
description = "grad norm with a parameter no layer has"
kind = "grad_norm_at_init"
variants = ["baseline"]
seeds = 1
preset = "tiny"
[sweep]
N = [1, 2]
[measure]
parameter = "no_such_module.weight"
""")
    assert cli.main(["run", "--experiment", "gn_bad", "-q", "--results-dir", "res", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "key 'measure.parameter': 'no_such_module.weight' is not a layer parameter" in err[0]
    assert "feed_forward.w_2.weight" in err[0]  # the message lists what exists
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("extra, message", [
    (["--variants", "pre_norm"], "--variants cannot be combined with --experiment"),
    (["--grid"], "--grid cannot be combined with --experiment"),
    (["--preset", "quick"], "--preset cannot be combined with --experiment"),
    (["--seed-start", "3"], "--seed-start with --experiment needs --seeds N"),
], ids=["variants", "grid", "preset", "seed_start_alone"])
def test_options_the_experiment_file_decides_are_refused_not_ignored(tmp_path, monkeypatch, capsys, extra, message):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "tr", TINY.format(extra=""))
    assert cli.main(["run", "--experiment", "tr", *extra, "--results-dir", "res", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "res").exists()


def test_seeds_1_given_with_an_experiment_is_honoured(registry, tmp_path):
    p = write(tmp_path, "tr", TINY.format(extra=""))  # the file asks for 2 seeds
    plan = ex.plan_from_experiment(str(p), registry, args(seeds=1, seeds_given=True))
    assert plan.seeds == [0]
    plan = ex.plan_from_experiment(str(p), registry, args(seeds=2, seed_start=5, seeds_given=True))
    assert plan.seeds == [5, 6]
    assert ex.plan_from_experiment(str(p), registry, args(seeds=1, seeds_given=False)).seeds == [0, 1]


def test_experiments_name_failures_with_the_one_helper_and_it_never_raises():
    from harness.errors import failure_reason

    assert not hasattr(ex, "failure_line") and not hasattr(ex, "parse_set_items")  # no second name (issue 20)
    assert failure_reason(RuntimeError("")) == "RuntimeError"
    assert failure_reason(ValueError("first\nsecond")) == "ValueError: first"
    assert failure_reason(KeyError("x" * 400)).startswith("KeyError: 'xxx") and len(failure_reason(KeyError("x" * 400))) == 310


def test_theory_slope_is_data_of_the_experiment_file(tmp_path):
    exp = ex.load_experiment(ex.find_experiment("xiong_grad_norm_at_init"))
    assert exp.measure["theory_slope"] == {"baseline": 0.0, "pre_norm": -0.5}
    p = write(tmp_path, "bad", TINY.format(extra='kind = "grad_norm_at_init"\n[sweep]\nN = [1, 2]\n'
                                                 '[measure]\ntheory_slope = { baseline = "flat" }'))
    with pytest.raises(ex.ExperimentError, match="key 'measure.theory_slope': expected a table of variant"):
        ex.load_experiment(p)
    # a run stored before the key existed takes it from the file of the same name
    meta = {"experiment": "xiong_grad_norm_at_init",
            "experiment_spec": {**exp.to_meta(), "measure": {"batches": 16, "parameter": "feed_forward.w_2.weight"}}}
    assert ex.spec_from_meta(RunMeta.from_dict(meta)).measure["theory_slope"] == {"baseline": 0.0, "pre_norm": -0.5}


def test_a_run_from_an_experiment_file_path_resumes_from_its_own_record(tmp_path, monkeypatch):
    """A run started from a .toml path (not a name the lookup knows) resumes with options given
    (here --set) from the experiment stored in its config.json; it failed with 'unknown
    experiment' when the resume looked the experiment up by name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    toml = tmp_path / "elsewhere" / "mini.toml"
    toml.write_text('description = "smoke"\nsource = "test"\nvariants = ["baseline"]\nbaseline = "baseline"\n'
                    'metric = "heldout_ce"\nseeds = 2\npreset = "tiny"\n\n[config]\ntrain.steps = 5\n')
    assert cli.main(["run", "--experiment", str(toml), "--run-id", "x", "--no-check", "-q"]) == 0
    run = tmp_path / "results" / "x"
    (run / "trials" / "baseline__s1.json").unlink()
    assert cli.main(["run", "--resume", str(run), "--set", "train.steps=5", "-q"]) == 0
    assert (run / "trials" / "baseline__s1.json").is_file()
