"""Model keys that a component cannot use are refused in one line, every text that states a default
states the one the code uses, and plugin options accumulate wherever they are given."""
import re
from pathlib import Path

import pytest

from harness import cli
from harness.config import WINDOW_DEFAULT, ModelConfig
from harness.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("window", [-1, 1])
def test_a_window_no_sliding_window_can_train_is_refused(window):
    with pytest.raises(ConfigError, match="window must be >= 2"):
        ModelConfig(window=window).validate()
    assert ModelConfig(window=2).sliding_window() == 2 and ModelConfig(window=0, max_len=64).sliding_window() == 16


def test_window_1_on_the_command_line_is_one_line_and_exit_2(capsys):
    assert cli.main(["check", "--variants", "sliding_window", "--set", "model.window=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "window must be >= 2" in err[0]


def test_the_window_default_is_stated_as_the_code_computes_it(capsys):
    for max_len in (4, 8, 9, 64, 128):
        assert ModelConfig(max_len=max_len).sliding_window() == eval(WINDOW_DEFAULT, {"max_len": max_len})
    assert cli.main(["list"]) == 0
    listed = " ".join(capsys.readouterr().out.split())
    assert WINDOW_DEFAULT in listed.replace("| ", "").replace(" |", "") or WINDOW_DEFAULT.replace(" ", "") in \
        listed.replace(" ", "")
    docs = (ROOT / "docs" / "components.md").read_text()
    stated = set(re.findall(r"max\(2, max_len // 4\)|(?<!max\(2, )max_len // 4", docs + listed))
    assert stated == {WINDOW_DEFAULT}, f"a text states another window default: {stated}"


def test_plugin_files_given_before_and_after_the_command_both_load(tmp_path, capsys):
    a, b = tmp_path / "plug_a.py", tmp_path / "plug_b.py"
    for path, name in ((a, "from_a"), (b, "from_b")):
        path.write_text("from harness import Variant, hookimpl\n\n@hookimpl\ndef harness_add_variants():\n"
                        f"    return [Variant({name!r}, {{'norm': 'pre'}}, summary='x', source='test')]\n")
    assert cli.main(["--plugin", str(a), "list", "--plugin", str(b)]) == 0
    out = capsys.readouterr().out
    assert "from_a" in out and "from_b" in out
    assert cli.main(["-p", "no:variants.bugs", "list", "--plugin", str(a)]) == 0
    out = capsys.readouterr().out
    assert "from_a" in out and "bug_001_discarded_mask" not in out
