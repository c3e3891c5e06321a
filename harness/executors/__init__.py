"""Where trials run: in this process, in a pool of local worker processes, under time limits in worker processes
that can be ended, or on a Ray cluster.

Every executor receives :class:`harness.trial.TrialSpec` s and calls
``on_done(spec, result)`` with a :class:`harness.trial.TrialResult` **in the parent process** as
each trial ends, in completion order; the caller stores the result at once
(:meth:`harness.store.RunStore.write_trial`). A trial crosses a process boundary as an importable
function (:func:`~harness.executors.units.run_unit`,
:func:`~harness.executors.ray_cluster.ray_trial`) plus its spec's plain dict
(``TrialSpec.to_dict()``), and comes back as the result's dict (``TrialResult.to_dict()``), never
as a pickled model or closure: those two calls, here, are the only place the records are dicts
outside the files.

What a worker runs is a :class:`~harness.executors.units.WorkUnit`: one trial, or the trials of one vectorised
trial group (``--vectorise-seeds on``); :func:`~harness.executors.units.run_unit` runs either in the worker and
:meth:`~harness.executors.units.WorkUnit.results` reads either back, so no executor branches on what a unit holds.

* :func:`~harness.executors.sequential.run_sequential` (``--jobs 1``): one trial after the other in this process.
* :func:`~harness.executors.pool.run_process_pool` (``--jobs N``): N worker processes from ProcessPoolExecutor,
  each task a unit; started with
  :data:`START_METHOD` (no inherited OpenMP or CUDA state). Each worker calls
  ``torch.set_num_threads(threads)`` with ``threads = max(1, cores // N)`` unless ``--threads``
  says otherwise, so N workers never oversubscribe the cores. A worker that dies (killed by a
  signal or by the out-of-memory killer) breaks the pool; the trials it may have been running
  are then re-run one after the other in a one-worker pool, and the one that kills that worker
  too is recorded as ``failed`` -- the run goes on.
* :func:`~harness.executors.limits.run_limited` (``--trial-timeout``, ``--time-budget``): each unit in a worker
  process of its own that can be ended.
* :func:`~harness.executors.ray_cluster.run_ray` (``--executor ray``): Ray tasks with ``num_cpus = threads`` (and
  ``num_gpus = 1`` on CUDA). ``--address`` or ``RAY_ADDRESS`` name an existing cluster;
  otherwise a private local cluster on loopback is started with ``ray.init(address="local")``
  and shut down at the end.

Results are bitwise reproducible across executors for the same seed, config, device and
threads per trial: the number of intra-op threads changes the order of floating-point
reductions, so it is part of each trial's spec and recorded in each row.
"""

# Import each name from the module that defines it: units, sequential, pool, limits, ray_cluster.
