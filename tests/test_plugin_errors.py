"""A plugin's mistakes give one line naming the file and the line of its hook, exit 2, no traceback.

Written against the pluggy the project allows (``pluggy>=1.3``): nothing here reads an attribute of
pluggy's exceptions, whose attributes differ between versions.
"""
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys

import pluggy
import pytest

import harness
from harness import cli
from harness.errors import PluginError
from harness.plugins import PluginSpec, _validation_error, get_plugin_manager
from harness.registry import Registry

from .conftest import ROOT

HEAD = "from harness import Variant, hookimpl\n\n\n"

#: plugin file name -> (its text, what its one line must say); each hook's ``def`` is on line 5.
BROKEN = {
    "misspelled": (HEAD + "@hookimpl\ndef harness_add_variant():\n    return [Variant('mine', {})]\n",
                   r"misspelled\.py:5: unknown hook 'harness_add_variant'; did you mean 'harness_add_variants'\?"),
    "with_argument": (HEAD + "@hookimpl\ndef harness_add_variants(registry):\n    return [Variant('mine', {})]\n",
                      r"with_argument\.py:5: harness_add_variants\(\) takes argument\(s\) registry but the hook "
                      r"harness_add_variants passes none"),
    "no_hookimpl": (HEAD + "\ndef harness_add_variants():\n    return [Variant('mine', {})]\n",
                    r"no_hookimpl\.py' registered no hooks: harness_add_variants \(.*no_hookimpl\.py:5\) lacks "
                    r"@hookimpl"),
    "not_a_list": (HEAD + "@hookimpl\ndef harness_add_variants():\n    return Variant('mine', {})\n",
                   r"not_a_list\.py:5: harness_add_variants\(\) must return a list of Variant, got a Variant"),
    "list_of_names": (HEAD + "@hookimpl\ndef harness_add_variants():\n    return ['mine']\n",
                      r"list_of_names\.py:5: harness_add_variants\(\) must return a list of Variant, "
                      r"got a list holding str"),
}


def _write(tmp_path, name):
    path = tmp_path / f"{name}.py"
    path.write_text(BROKEN[name][0])
    return path


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_plugin_mistake_is_one_line_exit_2(tmp_path, capsys, name):
    path = _write(tmp_path, name)
    code = cli.main(["--plugin", str(path), "list"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("harness: error: plugin ") and path.name in lines[0]
    assert re.search(BROKEN[name][1], lines[0]), lines[0]


def test_misspelled_hook_in_a_real_process_exits_2_without_traceback(tmp_path):
    """The case whose error handler itself used to fail (``exc.plugin_name``): the whole process."""
    _write(tmp_path, "misspelled")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "harness", "--plugin", "misspelled.py", "run", "--preset", "tiny",
                        "--results-dir", "results"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [  # the file as given, relative to the working directory
        "harness: error: plugin misspelled.py:5: unknown hook 'harness_add_variant'; did you mean 'harness_add_variants'?"]
    assert not (tmp_path / "results").exists()  # refused before anything was written


def test_python_api_raises_the_same_line(tmp_path, capsys):
    path = _write(tmp_path, "with_argument")
    with pytest.raises(PluginError) as exc:
        harness.check(variants=["baseline"], plugin_files=[str(path)])
    with pytest.raises(PluginError) as exc_run:
        harness.run(variants=["baseline"], plugin_files=[str(path)], preset="tiny", seeds=1,
                    results_dir=str(tmp_path / "results"))
    assert cli.main(["--plugin", str(path), "list"]) == 2
    line = capsys.readouterr().err.strip()
    assert line == f"harness: error: {exc.value}" == f"harness: error: {exc_run.value}"
    assert "\n" not in str(exc.value) and not (tmp_path / "results").exists()


def test_a_good_hook_does_not_hide_a_misspelled_one(tmp_path):
    """One correct hook registers, so the plugin is not empty; the misspelled one is still an error."""
    path = tmp_path / "half.py"
    path.write_text(HEAD + "@hookimpl\ndef harness_add_variants():\n    return []\n\n\n"
                    "@hookimpl\ndef harness_add_component():\n    return []\n")
    with pytest.raises(PluginError, match=r"half\.py:10: unknown hook 'harness_add_component'; did you mean "
                                          r"'harness_add_components'\?"):
        Registry.from_plugins(PluginSpec(files=[str(path)]))


def test_specname_optionalhook_defaults_and_wrappers_are_judged_as_pluggy_does(tmp_path):
    """What pluggy accepts passes (a renamed hook via ``specname``, an argument with a default, an
    unknown ``optionalhook``); a renamed hook whose specname is misspelled and a wrapper that does not
    yield are errors."""
    good = tmp_path / "good.py"
    good.write_text(HEAD + "@hookimpl(specname='harness_add_variants')\ndef mine(extra=1):\n"
                    "    return [Variant('mine', {})]\n\n\n@hookimpl(optionalhook=True)\ndef harness_later():\n"
                    "    return []\n")
    assert "mine" in Registry.from_plugins(PluginSpec(files=[str(good)])).variants
    renamed = tmp_path / "renamed.py"
    renamed.write_text(HEAD + "@hookimpl(specname='harness_add_variant')\ndef mine():\n    return []\n")
    with pytest.raises(PluginError, match=r"renamed\.py:5: unknown hook 'harness_add_variant'"):
        Registry.from_plugins(PluginSpec(files=[str(renamed)]))
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(HEAD + "@hookimpl(wrapper=True)\ndef harness_add_variants():\n    return []\n")
    with pytest.raises(PluginError, match=r"wrapper\.py:5: harness_add_variants\(\) is marked as a hook wrapper"):
        Registry.from_plugins(PluginSpec(files=[str(wrapper)]))


def test_a_file_without_functions_named_like_hooks_says_what_a_hook_is(tmp_path):
    path = tmp_path / "empty.py"
    path.write_text("X = 1\n")
    with pytest.raises(PluginError, match=r"registered no hooks: a hook is a function named as one of "
                                          r"harness_add_components, .*@hookimpl"):
        Registry.from_plugins(PluginSpec(files=[str(path)]))


class _EntryPoint:
    def __init__(self, name, path):
        self.name, self.value = name, f"{path.stem}:"
        spec = importlib.util.spec_from_file_location(path.stem, path)
        self.module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.module)

    def load(self):
        return self.module


def test_an_installed_plugin_with_a_mistake_is_named_and_skipped_or_aborts_strict(tmp_path, monkeypatch):
    eps = [_EntryPoint("broken", _write(tmp_path, "misspelled"))]
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: eps if kw.get("group") == "harness" else real(**kw))
    monkeypatch.delenv("HARNESS_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    reg = Registry.from_plugins()
    assert [w for w in reg.warnings if "misspelled.py:5: unknown hook" in w and "'broken'" in w and "skipped" in w]
    assert "baseline" in reg.variants and "mine" not in reg.variants
    with pytest.raises(PluginError, match=r"misspelled\.py:5: unknown hook"):
        Registry.from_plugins(PluginSpec(strict=True))


def test_pluggys_own_validation_error_becomes_one_line_whatever_its_attributes():
    """pluggy 1.6's error has ``plugin`` and no ``plugin_name``; an error with neither still gives a line."""
    pm = get_plugin_manager()
    plugin = pm.get_plugin("variants.presets")
    err = _validation_error(pm, pluggy.PluginValidationError(plugin, "Plugin 'x' for hook 'h'\nhookimpl: h(a)\n"))
    assert str(err) == "plugin 'variants.presets': Plugin 'x' for hook 'h'; hookimpl: h(a)"
    bare = Exception("unknown hook 'h'\n")
    assert str(_validation_error(pm, bare)) == "unknown hook 'h'"
    assert str(_validation_error(pm, bare, "my.py")) == "plugin 'my.py': unknown hook 'h'"
