import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_PLUGIN = ROOT / "examples" / "harness-example" / "harness_example.py"

# Tests never pick up plugins installed in the environment unless they ask for them.
os.environ.setdefault("HARNESS_DISABLE_PLUGIN_AUTOLOAD", "1")
# One intra-op thread per pytest-xdist worker (``-n 2`` on 2 cores: two workers, one core each);
# up to two in a plain single-process run.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))

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


def builtin_variant_names():
    return sorted(n for n, v in Registry.from_plugins().variants.items() if not v.buggy)


def pytest_configure(config):
    sys.path.insert(0, str(ROOT))
