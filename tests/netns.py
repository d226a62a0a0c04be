"""Two hosts on one machine: network namespaces joined by a veth pair.

Each host has its own network stack and address (10.236.N.1 and .2), and each
command started on it also gets its own host name (a UTS namespace), its own
/dev/shm (a private tmpfs, so shared memory cannot cross hosts, as on real
machines) and an /etc/hosts naming both hosts (node01, node02), in a mount
namespace of its own. Needs root and ``ip netns``; :func:`two_hosts` skips the
test with the reason when either is missing. Namespaces are deleted on exit,
whatever happened.

Example::

    with two_hosts() as hosts:
        proc = subprocess.Popen(hosts.command(0, ["python", "train.py"]))
"""
import contextlib
import os
import shutil
import subprocess
import tempfile

import pytest

NAMES = ("node01", "node02")
SETUP = ('hostname "$EPL_TEST_HOSTNAME" && mount -t tmpfs -o size=512m tmpfs /dev/shm && '
         'mount --bind "$EPL_TEST_HOSTS_FILE" /etc/hosts && exec "$@"')


class TwoHosts(object):
    """Addresses, names and command prefixes of the two hosts."""

    def __init__(self, tag, subnet, folder):
        self.namespaces = ("epl%sa" % tag, "epl%sb" % tag)
        self.addresses = ("%s.1" % subnet, "%s.2" % subnet)
        self.names = NAMES
        self.hosts_file = os.path.join(folder, "hosts")
        with open(self.hosts_file, "w") as out:
            out.write("127.0.0.1 localhost\n")
            for address, name in zip(self.addresses, self.names):
                out.write("%s %s\n" % (address, name))

    def command(self, host, argv):
        """``argv`` run on host ``host`` (0 or 1), in its namespaces."""
        return (["ip", "netns", "exec", self.namespaces[host], "env",
                 "EPL_TEST_HOSTNAME=" + self.names[host],
                 "EPL_TEST_HOSTS_FILE=" + self.hosts_file,
                 "unshare", "--uts", "--mount", "--", "sh", "-c", SETUP, "sh"] + list(argv))


def _run(*argv):
    return subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=30)


@contextlib.contextmanager
def two_hosts():
    """A :class:`TwoHosts`, or the test is skipped with the reason it cannot be made."""
    if os.geteuid() != 0:
        pytest.skip("two hosts need network namespaces, which need root")
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            pytest.skip("two hosts need `%s`, which is not installed" % tool)
    tag = str(os.getpid() % 100000)
    subnet = "10.236.%d" % (os.getpid() % 250)
    folder = tempfile.mkdtemp(prefix="epl-hosts-")
    hosts = TwoHosts(tag, subnet, folder)
    veth = ("ve%sa" % tag, "ve%sb" % tag)
    made = []
    try:
        for namespace in hosts.namespaces:
            result = _run("ip", "netns", "add", namespace)
            if result.returncode:
                pytest.skip("cannot make network namespaces here (ip netns add: %s)"
                            % result.stdout.decode(errors="replace").strip())
            made.append(namespace)
        steps = [("ip", "link", "add", veth[0], "type", "veth", "peer", "name", veth[1])]
        for index, namespace in enumerate(hosts.namespaces):
            inside = ("ip", "netns", "exec", namespace)
            steps += [("ip", "link", "set", veth[index], "netns", namespace),
                      inside + ("ip", "addr", "add", hosts.addresses[index] + "/24", "dev",
                                veth[index]),
                      inside + ("ip", "link", "set", veth[index], "up"),
                      inside + ("ip", "link", "set", "lo", "up")]
        for step in steps:
            result = _run(*step)
            if result.returncode:
                pytest.skip("cannot join the two namespaces (%s: %s)" % (
                    " ".join(step), result.stdout.decode(errors="replace").strip()))
        probe = _run(*hosts.command(0, ["hostname"]))
        if probe.returncode or probe.stdout.decode().strip() != NAMES[0]:
            pytest.skip("cannot give a namespace its own host name and /dev/shm (%s)"
                        % probe.stdout.decode(errors="replace").strip())
        yield hosts
    finally:
        for namespace in made:
            _run("ip", "netns", "del", namespace)   # its end of the veth pair goes with it
        shutil.rmtree(folder, ignore_errors=True)
