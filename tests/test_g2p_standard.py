"""``task.split=standard`` of ``g2p``: the CNTK CMUdict train and test lists as committed (checksums,
counts), the split built from them (test = the test list, dev a slice of the train list, all three
disjoint), the option's validation, the hash split left as it was, and one tiny run on it end to end.
Kept cheap: each lexicon loads once per worker (~4 s)."""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import tomllib
from pathlib import Path

import pytest
import torch

from harness.config import get_preset
from harness.settings import hash_view
from harness.tasks import cmudict_lists
from harness.tasks.base import PAD
from harness.tasks.g2p import LETTERS, G2PTask, Lexicon, lexicon, split_of, standard_side
from harness.tasks import splits

from .conftest import ROOT, cli_in_process

pytestmark = pytest.mark.xdist_group("g2p")  # one worker loads the lexicons

DATA = ROOT / "harness" / "tasks" / "data" / "cmudict_standard"
#: file -> (SHA-256 of the original CRLF file, SHA-256 of the committed .gz, lines, distinct words), as
#: the folder's README.md states them (the counts checked by hand against the files from CNTK).
FILES = {
    "cmudict-0.7b.train.gz": ("58cba5cd56d28bcb529c85e752123b00c1f748f8163eacbe368ab844d7f8d6a6",
                              "af9b9bae22499fce7d021291f30b6b716796dab1a663959df28e1809ed1e5b08", 114399, 106794),
    "cmudict-0.7b.test.gz": ("f216624c0432a201179d22a6ef9fb7ebd25ff65342ac2a0214a0752c6b6d3550",
                             "ea95ae259816107f0a82ccb1b7c39fcefb0d6adad625fe211713d179dc4c9016", 12855, 11994),
}


def word(ids) -> str:
    return "".join(LETTERS[i - 3] for i in ids)


@pytest.fixture(scope="module")
def std() -> Lexicon:
    return lexicon("standard")


@pytest.fixture(scope="module")
def cfg():
    return G2PTask().fit(get_preset("tiny").override({"train.task": "g2p", "task.split": "standard",
                                                       "train.steps": 30}), set())


@pytest.mark.parametrize("name", FILES)
def test_the_committed_lists_hold_their_checksums_and_counts(name):
    raw_digest, gz_digest, lines, words = FILES[name]
    gz = (DATA / name).read_bytes()
    raw = gzip.decompress(gz)
    assert hashlib.sha256(gz).hexdigest() == gz_digest
    assert hashlib.sha256(raw).hexdigest() == raw_digest
    text = raw.decode("ascii")
    assert text.count("\r\n") == lines and text.endswith("\r\n") and "\r\n".join(text.split("\r\n")) == text
    assert len({ln.partition("  ")[0] for ln in text.split("\r\n") if ln}) == words
    readme = (DATA / "README.md").read_text()
    assert raw_digest in readme and gz_digest in readme and f"{lines:,}" in readme and f"{words:,}" in readme
    listed = {v[0]: v[1] for v in cmudict_lists.LISTS.values()}
    assert listed[name] == raw_digest  # what the loader checks is what the files hold
    assert not any(p.suffix not in (".gz", ".md") for p in DATA.iterdir())  # the two lists and the README


def test_a_damaged_list_is_refused(monkeypatch):
    monkeypatch.setitem(cmudict_lists.LISTS, "test", ("cmudict-0.7b.test.gz", "0" * 64, 12855, 11994))
    with pytest.raises(RuntimeError, match="damaged"):
        cmudict_lists.read_list("test")


def test_a_lexicon_of_an_unknown_split_is_refused():
    with pytest.raises(ValueError, match="hash, standard"):
        Lexicon("stadnard")  # never read as the standard lists


def test_the_lists_ship_as_package_data():
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {p.name for glob in spec["harness.tasks"] for p in (ROOT / "harness" / "tasks").glob(glob)}
    assert set(FILES) <= shipped


def test_test_is_the_test_list_dev_a_slice_of_train_all_disjoint(std):
    lists = {k: {w.lower() for w in cmudict_lists.read_list(k)} for k in ("train", "test")}
    train = {word(w) for w, _ in std.train_pairs}
    dev, test = {word(w) for w, _ in std.dev_words}, {word(w) for w, _ in std.test_words}
    assert not lists["train"] & lists["test"]
    assert test <= lists["test"] and dev <= lists["train"] and train <= lists["train"]
    assert not train & test and not dev & train and not dev & test
    assert all(standard_side(w) == "dev" for w in dev) and not any(standard_side(w) == "dev" for w in train)
    # the counts docs/tasks.md states: every word of the a-z alphabet kept, apostrophes dropped
    assert (len(train), len(dev), len(test), len(std.train_pairs)) == (95728, 5030, 11290, 102204)
    assert std.excluded == {"train": {"symbols": 6035, "length": 1}, "test": {"symbols": 704, "length": 0}}
    assert sum(len(refs) for _, refs in std.test_words) == 12057
    assert abs(len(dev) / (len(dev) + len(train)) - 0.05) < 0.005
    # not the hash split's rule: the hash split would have put test-list words in training
    assert any(split_of(w) == "train" for w in list(test)[:200])


def test_several_pronunciations_become_the_references(std):
    abs_ = [refs for w, refs in std.test_words if word(w) == "abs"]
    spoken = {" ".join(std.phones[i - 29] for i in r) for r in abs_[0]}
    assert spoken == {"AE B Z", "EY B IY EH S"}


def test_the_split_reaches_every_set_and_the_training_stream(std, cfg):
    shared = G2PTask()  # the registry's instance reads the hash split until bound
    test = splits.test_set(shared, cfg)
    got = {word(r[r != PAD].tolist()) for r in test.src}
    assert len(got) == cfg.train.eval_sequences and got <= {word(w) for w, _ in std.test_words}
    dev = splits.dev_set(shared, cfg, test.src)
    assert {word(r[r != PAD].tolist()) for r in dev.src} <= {word(w) for w, _ in std.dev_words}
    assert splits.split_overlaps(shared, cfg, seed=0) == {"test": (0, 64), "dev": (0, 200), "dev_test": (0, 200)}
    bound = shared.for_config(cfg)
    assert bound.split == "standard" and shared.split == "hash" and bound.for_config(cfg) is bound
    drawn = {word(r[r != PAD].tolist()) for _ in range(10) for r in next(bound.batches(cfg, torch.Generator())).src}
    assert drawn <= {word(w) for w, _ in std.train_pairs}


def test_an_unbound_task_handed_a_standard_config_refuses(cfg):
    """A caller that forgot ``for_config`` would train on one split and score on the other: it fails loudly."""
    with pytest.raises(RuntimeError, match="for_config"):
        next(G2PTask().batches(cfg, torch.Generator()))


@pytest.mark.parametrize("how", ["trial", "group"])
def test_a_standard_trial_never_reads_the_hash_lexicon(cfg, monkeypatch, how):
    """Spy on every lexicon a trial asks for: a sequential trial and a vectorised group of two seeds on
    ``task.split=standard`` (training, the periodic dev evaluations, the batched test decoding) read only
    the standard one; a call site that forgot ``for_config`` would ask for ``hash`` (or raise)."""
    from harness import group as group_mod
    from harness.tasks import g2p as g2p_mod, seeds as seeds_mod
    from harness.train import run_trial
    from harness.trial import TrialSpec

    asked: list[str] = []
    real = g2p_mod.lexicon

    def spy(split="hash"):
        asked.append(split)
        return real(split)
    monkeypatch.setattr(g2p_mod, "lexicon", spy)
    monkeypatch.setattr(seeds_mod, "lexicon", spy)
    run = cfg.override({"train.steps": 6, "train.eval_every": 3, "train.eval_sequences": 32}).to_dict()
    specs = [TrialSpec("baseline", s, run, device="cpu", threads=1) for s in (0, 1)]
    results = [run_trial(specs[0])] if how == "trial" else group_mod.run_group(specs)
    assert all(r.row["status"] == "ok" for r in results), [r.row.get("reason") for r in results]
    assert asked and set(asked) == {"standard"}


def test_poisoning_the_test_list_moves_only_the_test_side(std, monkeypatch):
    """The test list decides the test words and nothing else: garbage pronunciations for every test word
    leave training pairs and dev words as they were."""
    real = cmudict_lists.read_list

    def poisoned(name):
        out = real(name)
        return {w: [("ZH",) * 3] for w in out} if name == "test" else out
    monkeypatch.setattr(cmudict_lists, "read_list", poisoned)
    bad = Lexicon("standard")
    assert bad.train_pairs == std.train_pairs and bad.dev_words == std.dev_words
    assert [w for w, _ in bad.test_words] != [] and bad.test_words != std.test_words
    assert {w for w, _ in bad.test_words} == {w for w, _ in std.test_words}


def test_the_hash_split_is_unchanged_and_hashes_as_before():
    lex = lexicon("hash")
    assert (lex.n_train_words, len(lex.dev_words), len(lex.test_words)) == (100298, 5307, 11886)
    cfg = get_preset("g2p")
    before = {k: v for k, v in cfg.to_dict().items() if k != "task"}  # a config stored before task.split
    assert hash_view(cfg.to_dict()) == hash_view(before)
    std = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, split="standard"))
    assert hash_view(std.to_dict()) != hash_view(before)


@pytest.mark.parametrize("args, says", [
    (("--task", "g2p", "--set", "task.split=bogus"), "the g2p task offers task.split=hash or standard, got 'bogus'"),
    (("--task", "copy", "--set", "task.split=standard"), "the copy task offers task.split=hash, got 'standard'"),
    (("--task", "g2p", "--set", "task.split=Std!"), "task.split must be a split name"),
])
def test_a_bad_split_exits_2_with_one_line(tmp_path, args, says):
    out = cli_in_process("run", "--variants", "baseline", "--preset", "tiny", *args, "--results-dir", tmp_path)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and says in out.stderr
    assert "Traceback" not in out.stderr and not any(Path(tmp_path).iterdir())


def test_a_tiny_run_on_the_standard_split(tmp_path):
    out = cli_in_process("run", "--variants", "baseline", "--task", "g2p", "--set", "task.split=standard",
                         "--preset", "tiny", "--results-dir", tmp_path, "--run-id", "std", "-q")
    assert out.returncode == 0, out.stderr
    meta = json.loads((tmp_path / "std" / "config.json").read_text())
    assert meta["config"]["task"] == {"split": "standard", "path": ""}
    assert "standard CMUdict test list (of 11290 kept" in meta["heldout"] and "0/64" in meta["heldout"]
