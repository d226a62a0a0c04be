"""Workers that build no model replica only serve their devices.

When a pipeline spans workers (2 workers x 1 device, 2 stages), worker 0
builds the whole replica and places stage 1 on worker 1's device through TF's
distributed runtime; worker 1 only has to keep its server up. It does so
until every worker that drives it has finished (its server stops answering),
then exits with status 0 so launchers see a clean finish.
"""
import atexit
import logging
import os
import sys
import threading
import time

from epl.session.reachability import reachable, wait_until_reachable

LOG = logging.getLogger("epl")


def wait_for_drivers(hosts, poll=0.5, startup_timeout=600.0):
    """Block until the driver workers were up and then went away.

    The first phase polls fast: a driver cannot run a step before our server
    is up, but a tiny job can finish soon after, and we must see it alive once.
    """
    missing = wait_until_reachable(hosts, startup_timeout, poll=0.02)
    if missing:
        raise RuntimeError("EPL serving worker: driver worker(s) %s never came up within "
                           "%d s" % (missing, startup_timeout))
    misses = 0
    while misses < 3:
        time.sleep(poll)
        misses = 0 if all(reachable(h) for h in hosts) else misses + 1


def serve(env, plan):
    """Start this worker's server, serve until the drivers finish, then exit 0.

    The wait for the drivers to come up uses ``communication.timeout``.
    """
    worker = env.cluster.worker_index
    drivers = plan.drivers
    env.get_or_create_server()
    LOG.warning("EPL: worker %d builds no model replica; it serves its devices to worker(s) "
                "%s and exits when they finish", worker, drivers)
    wait_for_drivers([env.cluster.hosts[w] for w in drivers],
                     startup_timeout=env.config.communication.timeout)
    LOG.warning("EPL: worker %d: driver worker(s) finished; exiting", worker)
    sys.stdout.flush()
    sys.stderr.flush()
    if threading.current_thread() is threading.main_thread():
        os._exit(0)  # TF 1.15 servers cannot be shut down; a normal exit can hang
    sys.exit(0)


def linger_while_up(host, deadline):
    """Block while ``host`` (a worker's server) answers, at most ``deadline`` seconds.

    A worker whose variables another worker reads at the end of training (worker
    0's final checkpoint of split shards) must not take its server down first."""
    end = time.time() + deadline
    while time.time() < end and reachable(host):
        time.sleep(0.5)


def linger_at_exit(host, deadline, what="split shards"):
    """Register :func:`linger_while_up` to run when this process exits normally."""
    if host in _LINGERING:
        return
    _LINGERING.add(host)
    LOG.info("EPL: this worker holds %s that worker 0 saves; at exit it waits "
             "until worker 0 (%s) has finished (at most %d s)", what, host, deadline)
    atexit.register(linger_while_up, host, deadline)


_LINGERING = set()
