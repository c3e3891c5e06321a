"""Where ``--executor ray`` connects. Ray and sequential execution giving the same rows, with a
``--plugin`` file shipped to the Ray workers: tests/test_ray_cluster.py (a real two-node
cluster); ``--jobs 2`` against sequential: tests/test_determinism.py.
"""
from __future__ import annotations

from harness.env import ray_address


def test_ray_address_precedence(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address(None) == "local"  # never a bare ray.init() that attaches to a stale cluster
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert ray_address(None) == "10.0.0.5:6379"
    assert ray_address("ray://head:10001") == "ray://head:10001"
