"""The learning-rate schedule every trial trains with (Vaswani et al. 2017 §5.3, the Annotated
Transformer's ``rate``), through ``torch.optim.lr_scheduler.LambdaLR`` (:func:`harness.train.make_optimizer`).

Imports nothing of the package: :mod:`harness.train`, :mod:`harness.group` and :mod:`harness.tboard`
(the ``train/learning_rate`` curve) all use it.
"""
from __future__ import annotations

from typing import Callable


def noam_lambda(d_model: int, warmup: int, schedule: str = "noam") -> Callable[[int], float]:
    """The multiplier LambdaLR applies to the base lr at scheduler step ``step`` (0-based).

    ``noam``: d_model^-0.5 * min(s^-0.5, s * warmup^-1.5) with s = max(step, 1) (Annotated ``rate``).
    ``constant``: d_model^-0.5 (no warm-up; Xiong et al. 2020's no-warmup arm uses a fixed lr).
    """
    if schedule == "constant":
        return lambda step: d_model ** -0.5

    def rate(step: int) -> float:
        step = max(step, 1)
        return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)

    return rate
