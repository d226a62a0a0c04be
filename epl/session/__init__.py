"""Everything that happens at the session boundary of a parallelized graph.

* ``runner``: broadcast replica 0's variables before the first step, guard every
  run that contains collectives (peer preflight, watchdog);
* ``watchdog``: a stuck collective ends the process with a message, never a hang;
* ``reachability``: is a worker's server up;
* ``serving``: workers that build no copy only serve their devices;
* ``roles``: which worker writes checkpoints and summaries, and how
  MonitoredTrainingSession's chief arguments are set on each worker.

The TF hooks (:mod:`epl.parallel.session_hooks`) only route calls here: the
policy lives in these modules.
"""
