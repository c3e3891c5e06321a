import contextlib
import importlib
import io
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_PLUGIN = ROOT / "examples" / "harness-example" / "harness_example.py"

# Tests never pick up plugins installed in the environment unless they ask for them.
os.environ.setdefault("HARNESS_DISABLE_PLUGIN_AUTOLOAD", "1")
# Terminal output is fitted to the terminal's width (harness.report.terminal.terminal_width): every
# test sees a 120-column one, whatever terminal runs the suite (a test that means 80 sets COLUMNS).
os.environ["COLUMNS"] = "120"


def _share_cores_with_other_workers() -> int:
    """Under pytest-xdist (``-n W``), pin this worker to its own share of the cores (worker i gets
    cores i, i+W, ...; one core each with ``-n 2`` on 2 cores) and return the share's size.

    Everything the worker starts inherits the share, and the harness sizes its threads from it
    (``available_cores()`` reads the affinity mask): a trial in the worker, a ``--jobs 2`` pool
    or a CLI subprocess never runs more threads than its share. Without this, two workers each
    training with 2 OpenMP threads on 2 cores spin against each other (4 tiny trials: 39.7 s of
    CPU unpinned vs 4.8 s pinned to one core on the shared machine). Outside xdist (or without
    ``sched_setaffinity``) nothing is pinned and the answer is the usual cap of 2 threads.
    """
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and count.isdigit() and hasattr(os, "sched_setaffinity")):
        return min(2, torch.get_num_threads())
    cores, index, workers = sorted(os.sched_getaffinity(0)), int(worker[2:]), int(count)
    mine = cores[index::workers] if len(cores) >= workers else [cores[index % len(cores)]]
    os.sched_setaffinity(0, mine)
    return min(2, len(mine))


# One intra-op thread per xdist worker on 2 cores (-n 2); up to 2 in a plain single-process run.
torch.set_num_threads(_share_cores_with_other_workers())

from harness import cli  # noqa: E402
from harness.config import ModelConfig  # noqa: E402
from harness.registry import Registry  # noqa: E402


@pytest.fixture
def registry():
    """A fresh registry (fresh plugin manager) with the built-ins only."""
    return Registry.from_plugins()


@pytest.fixture
def small_cfg():
    return ModelConfig(N=2, d_model=32, h=4, d_ff=64, dropout=0.0, max_len=32)


def padded_batch(batch=4, s=9, t=10, vocab=11, seed=0):
    """A copy-task-like batch with real source and target padding."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (batch, s), generator=g)
    tgt = torch.randint(3, vocab, (batch, t), generator=g)
    tgt[:, 0] = 1
    for i in range(batch):
        src[i, s - 1 - i:] = 0
        tgt[i, t - 1 - i:] = 0
    return src, tgt


def import_every_harness_module() -> None:
    """Import every module of the harness package (not ``__main__``, which runs the CLI). Called
    once per process below, about 1 s: a test that monkeypatches a harness function (the fuzzer's
    fakes, a ``monkeypatch.setattr``) can then never be the first import of a module that binds the
    patched name with ``from .x import name``, which would keep the fake after the undo for every
    later test in that worker."""
    import harness

    for info in pkgutil.walk_packages(harness.__path__, "harness."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)


import_every_harness_module()


def cli_in_process(*args, cwd=None) -> subprocess.CompletedProcess:
    """``python -m harness ARGS`` run in this process (:func:`harness.cli.main`): its exit code and
    what it printed, as a ``CompletedProcess``. It saves a fresh interpreter's imports (torch,
    scipy, matplotlib: about 3 s a call); what needs a real process (signals, an exit by an
    uncaught exception, ``--help``'s imports, worker processes' output) runs a subprocess instead."""
    out, err, old, argv = io.StringIO(), io.StringIO(), os.getcwd(), sys.argv
    sys.argv = [str(Path(cli.__file__).with_name("__main__.py")), *map(str, args)]  # as `python -m harness` does
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main([str(a) for a in args])
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.chdir(old)
        sys.argv = argv
    return subprocess.CompletedProcess(["harness", *map(str, args)], code, out.getvalue(), err.getvalue())


@pytest.fixture
def python_ctrl_c():
    """Ctrl-C raising ``KeyboardInterrupt`` in this process for the test, as in a terminal. A
    process started in the background by a non-interactive shell (``nohup pytest ... &``)
    inherits SIGINT ignored, and then the loop's Ctrl-C hold (``harness.checkpoint``) rightly
    stands aside and a SIGINT the test sends is lost: the test would wait out its deadlines and
    see the run finish. The old handler comes back afterwards."""
    import signal

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def builtin_variant_names():
    """The variants of ``all`` (not buggy, in no group; the ``modern`` group: tests/test_modern.py)."""
    return sorted(n for n, v in Registry.from_plugins().variants.items() if not v.buggy and not v.group)


def pytest_configure(config):
    sys.path.insert(0, str(ROOT))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` first: under ``-n 2 --dist loadgroup`` the longest ones (the 2-node Ray
    cluster, ~30-50 s) then overlap the rest instead of running alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: otherwise in file order
