"""The fork server that local worker processes start from (``run --jobs N``, :mod:`harness.executors`).

Kept free of torch so that the command line can start the server before it imports torch itself
on a GPU machine (:func:`gpu_likely`): the server then imports :data:`FORKSERVER_PRELOAD` (torch and
the harness, several seconds where a CUDA build of torch loads slowly) while this process imports,
plans and runs the pre-training check, and the run's first workers fork from a ready server. On a
CPU-only machine the server starts with the run's pool as before (:func:`harness.beside.warm_workers`):
there the early start gained ~0.2 s and cost a core's second of importing to every command that
then needs no workers (bad input, a single trial).
"""
from __future__ import annotations

import multiprocessing
import os

#: Start method of the local worker processes (see :mod:`multiprocessing`): ``forkserver``
#: where the OS has it (workers are forked from a clean server process that has imported
#: :mod:`harness.train` once, so they start in milliseconds instead of re-importing torch),
#: else ``spawn``. Neither inherits the parent's threads, OpenMP pool or CUDA context.
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"

#: Modules the fork server imports before forking workers: the harness's trial code (torch with it), and
#: ``torch._dynamo``, which every worker would otherwise import on its own at its first trial (torch's
#: optimizers import it when they are built, and ``torch.use_deterministic_algorithms`` imports Inductor's
#: config with it): most of a second a worker. Neither initialises CUDA, so the
#: workers can still start theirs.
FORKSERVER_PRELOAD = ["harness.train", "torch._dynamo"]


#: Device nodes that a loaded GPU driver creates (NVIDIA's control device, AMD ROCm's), checked without torch.
GPU_NODES = ("/dev/nvidiactl", "/dev/kfd")


def gpu_likely() -> bool:
    """Whether this machine has a GPU driver loaded (a :data:`GPU_NODES` entry exists): where a run's
    device ``auto`` may be CUDA, decided without importing torch."""
    return any(os.path.exists(node) for node in GPU_NODES)


def start_fork_server() -> bool:
    """Start the fork server now, if this process has none yet: it imports :data:`FORKSERVER_PRELOAD`
    in a process of its own and returns at once. Returns whether a fork server runs (False where
    the start method is ``spawn``). An unused server exits with this process."""
    if START_METHOD != "forkserver":
        return False
    import multiprocessing.forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
    multiprocessing.forkserver.ensure_running()
    return True
