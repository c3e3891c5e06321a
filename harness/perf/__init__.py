"""How fast the harness trains and what it costs itself: ``python -m harness bench`` and ``profile``.

- :mod:`harness.perf.bench`: each variant's training speed next to ``nn.Transformer`` (tokens/s,
  step time, peak memory, MFU).
- :mod:`harness.perf.settings`: one variant under two sets of settings (``bench --old``), interleaved.
- :mod:`harness.perf.seeds`: seeds per second (``bench --group-sizes``): sequential, vectorised
  trial groups and, on CUDA, captured steps.
- :mod:`harness.perf.overhead`: the harness's own share of a trial's wall time (``profile``).
"""
