"""One host's agent in the two-host tests: start this host's tasks, wait for them.

Usage: node_agent.py SPEC.json, where SPEC is a list of {"argv", "env", "log"}.
It plays slurmstepd (or a machine's shell): the tasks it starts share this
process's namespaces (network, host name, /dev/shm), as processes on one real
host do. Each task's output goes to its "log" file and its exit code to
"<log>.code"; the agent exits with the first non-zero code (0 if all passed).
"""
import json
import subprocess
import sys


def main(spec_path):
    with open(spec_path) as handle:
        tasks = json.load(handle)
    procs = []
    for task in tasks:
        log = open(task["log"], "wb")
        procs.append((subprocess.Popen(task["argv"], env=task["env"], stdout=log,
                                       stderr=subprocess.STDOUT), log, task["log"]))
    worst = 0
    for proc, log, path in procs:
        code = proc.wait()
        log.close()
        with open(path + ".code", "w") as out:
            out.write(str(code))
        worst = worst or code
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
