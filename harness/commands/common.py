"""Options and helpers shared by several sub-commands."""
from __future__ import annotations

import argparse
import shlex
import sys

from ..config import PRESETS, PRESET_NOTES, RunConfig
from ..errors import ConfigError
from ..plugins import PluginSpec
from ..registry import Registry
from ..request import PLAN_DEFAULTS


def plugin_spec(args: argparse.Namespace) -> PluginSpec:
    """The :class:`harness.plugins.PluginSpec` of parsed plugin options (:func:`add_plugin_options`): those
    given before the sub-command, then those given after it (each list accumulates across both places)."""
    def given(dest: str) -> list[str]:
        return list(getattr(args, dest, None) or []) + list(getattr(args, dest + AFTER, None) or [])

    strict = getattr(args, "strict_plugins", False) or getattr(args, "strict_plugins" + AFTER, False)
    return PluginSpec(modules=given("plugin_modules"), files=given("plugin_files"), strict=bool(strict))


#: Suffix of the plugin options' destinations on the sub-command parsers: argparse copies a sub-command's
#: namespace over the top-level one, so a ``--plugin`` after the sub-command would otherwise replace the
#: ``--plugin`` files given before it.
AFTER = "_after_command"


def add_plugin_options(p: argparse.ArgumentParser, suppress: bool) -> None:
    """``-p MODULE`` / ``-p no:NAME``, ``--plugin FILE.py`` and ``--strict-plugins`` on ``p``.

    Args:
        suppress: leave unset options out of the namespace (for the sub-command parsers, so that
            options given before the sub-command are not reset by it).
    """
    default = argparse.SUPPRESS if suppress else None
    after = AFTER if suppress else ""
    g = p.add_argument_group("plugins")
    g.add_argument("-p", dest="plugin_modules" + after, action="append", metavar="MODULE", default=default,
                   help="load a plugin module by import path (repeatable); -p no:NAME disables the plugin "
                        "registered as NAME (e.g. -p no:variants.bugs)")
    g.add_argument("--plugin", dest="plugin_files" + after, action="append", metavar="FILE.py", default=default,
                   help="load a plugin from a Python file (repeatable)")
    g.add_argument("--strict-plugins", dest="strict_plugins" + after, action="store_true",
                   default=argparse.SUPPRESS if suppress else False,
                   help="abort when an installed plugin fails to import or a hook raises "
                        "(default: warn and skip it)")


def add_selection(p: argparse.ArgumentParser, default: str = "all") -> None:
    p.add_argument("--variants", nargs="+", default=[default], metavar="NAME",
                   help="'all', variant names and shell-style globs, space- or comma-separated "
                        f"(default: {default}); buggy variants only by exact name or a 'bug*' glob")
    p.add_argument("--grid", action="store_true",
                   help="the full factorial over the slots norm x embedding x attention x mask instead")


class TaskAction(argparse.Action):
    """``--task NAME``: the same as ``--set train.task=NAME`` (appended to the overrides, so that
    ``--resume`` and experiment files treat it like any other override)."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = list(getattr(namespace, self.dest, None) or [])
        items.append(f"train.task={values!r}")
        setattr(namespace, self.dest, items)


def add_task(p: argparse.ArgumentParser) -> None:
    """``--task NAME`` (after ``--set``, which owns the ``overrides`` default)."""
    p.add_argument("--task", dest="overrides", action=TaskAction, metavar="NAME",
                   help="the task to train on (default: the preset's: copy; paper: copy_fixed); "
                        "same as --set train.task=NAME; tasks: python -m harness list")


def check_task(reg: Registry, cfg: RunConfig) -> None:
    """``cfg.train.task`` names a registered task that can run ``cfg``.

    Raises:
        UnknownNameError: no such task (with close matches); ConfigError: the task's own check
            (:meth:`harness.Task.validate`), e.g. ``copy_length`` with too small a ``model.max_len``.
    """
    reg.task(cfg.train.task).for_config(cfg).validate(cfg)


def preset_notes() -> str:
    """The presets' names for ``--preset``'s help; what each one is, ``python -m harness list`` prints
    (its "Presets" table, from :data:`harness.config.PRESET_NOTES`): a help page stays a page."""
    return ", ".join(PRESET_NOTES) + "; what each is: python -m harness list"


def add_config(p: argparse.ArgumentParser) -> None:
    notes = preset_notes()
    default = PLAN_DEFAULTS["preset"]
    p.add_argument("--preset", default=default, metavar="NAME", help=f"config preset: {notes}. Default: {default}")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config value, e.g. --set train.steps=200 --set model.d_model=128")
    add_task(p)
    p.add_argument("--device", default="auto", help="auto (cuda when present), cpu or cuda. Default: auto")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                   help="fp32, or bf16 mixed precision through torch.autocast (loss in float32)")


def add_output(p: argparse.ArgumentParser, prefix: str, what: str = "results", default_id: str | None = None,
               quiet_help: str = "no progress lines on stderr") -> None:
    """``--results-dir``, ``--run-id`` (default ``<prefix>-<timestamp>``, or as ``default_id``
    says) and ``--quiet``; ``what``: what the folder holds, for the help ("results", "run")."""
    stored = "results" if what == "results" else f"{what}s"
    p.add_argument("--results-dir", default="results", metavar="DIR",
                   help=f"where {stored} are stored (default results)")
    p.add_argument("--run-id", default=None,
                   help=f"name of the {what} folder (default: {default_id or prefix + '-<timestamp>'})")
    p.add_argument("--quiet", "-q", action="store_true", help=quiet_help)


def check_output(args) -> None:
    """``--run-id`` is a valid folder name and ``--results-dir`` is not empty (checked before
    anything runs).

    Raises:
        ConfigError: naming the option.
    """
    if getattr(args, "run_id", None) is not None:
        from ..store import check_name

        check_name(args.run_id)
    if getattr(args, "results_dir", None) == "":
        raise ConfigError("--results-dir must not be empty (give a folder, e.g. --results-dir results)")


def command_line(args=None) -> str:
    """The command as the user typed it, for reports; for a call of the Python API
    (:mod:`harness.api`), the equivalent command line (``args.argv``)."""
    argv = getattr(args, "argv", None)
    return "python -m harness " + shlex.join(sys.argv[1:] if argv is None else argv)


def resolve_config(args, registry: Registry | None = None) -> RunConfig:
    """``--preset`` + ``--set`` overrides, validated and, with ``registry``, fitted to the task
    (:func:`harness.planning.resolve_config`). Raises UnknownNameError / ConfigError."""
    from ..planning import resolve_config as resolve

    return resolve(args.preset, args.overrides, registry)


def load_registry(args) -> Registry:
    """The registry with the command line's plugins (:func:`harness.planning.load_registry`)."""
    from ..planning import load_registry as load

    return load(plugin_spec(args))


def select_variants(reg: Registry, args):
    """The variants of ``--variants`` (or ``--grid``)."""
    from ..request import split_patterns

    if getattr(args, "grid", False):
        return reg.grid()
    return reg.select(split_patterns(args.variants if isinstance(args.variants, list) else [args.variants]))


__all__ = ["add_selection", "add_config", "add_task", "check_task", "add_output", "check_output", "command_line", "resolve_config", "load_registry", "select_variants", "PRESETS"]
