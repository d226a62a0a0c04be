#!/usr/bin/env python3
"""The equivalence table of docs/tf2.md, from the logs of test runs.

Every equivalence test records the largest difference between a weight trained
under its mode and the same weight trained serially, and pytest prints them in a
section "equivalence: max |weight - serial weight| per test" (tests/conftest.py).
A CI run with both legs prints that section twice: the TF 1.15 leg's first, the
TF 2.x leg's second. This script reads one or more logs, takes the sections in
order as the table's columns, puts each test under one mode (the first rule of
``MODES`` that its id matches) and prints, per mode, how many tests measured
and the largest difference in each column. So the table is made from a run, not
by hand, and a reader can rebuild it:

    python3 tools/equivalence_table.py ci.log [--labels "TF 1.15.5" "TF 2.15.1"]

Standard library only (it runs beside the suite, not in it).
"""
import argparse
import re
import sys

HEADER = "equivalence: max |weight - serial weight| per test"
LINE = re.compile(r"^([0-9.]+(?:e[+-]?[0-9]+)?)  (\S.*)$")

# (mode, pattern on the test id); the first match wins, so the narrower modes
# (float16 training, ZeRO, memory savers combined) come before the broad ones.
MODES = (
    ("AMP (float16 compute vs float32 serial)", r"amp"),
    ("DP, fp16 communication", r"fp16"),
    ("ZeRO v0/v1/v2 (with checkpoints, savers)", r"zero"),
    ("Auto parallel (auto pipeline + DP)", r"auto_parallel|auto_pipeline"),
    ("Split (classifier) and MoE", r"[/_]split(?!s)|moe"),
    ("Memory savers combined (GC, offload, grouped)", r"(gc|offload|grouped)\+|memory_savers"),
    ("Gradient checkpointing", r"gradient_checkpoint|gc_collection|\[gc-"),
    ("Offload", r"offload"),
    ("Grouped apply", r"grouped"),
    ("IO slicing (2 workers)", r"io_slicing"),
    ("End of input (local and 2 workers)", r"end_of_input"),
    ("Multi-worker DP and pipelines (2 workers)", r"multiworker|launch"),
    ("GA (corpus, pipeline file)", r"ga_\d|accumulat"),
    ("Pipelines (both schedules; DP over pipelines)", r"pipeline"),
    ("Optimizers and wrapper optimizers under DP", r"optimizer"),
    ("DP (local), communication options, odd shapes", r"."),
)


def mode_of(test):
    """The table row of one test id."""
    for mode, pattern in MODES:
        if re.search(pattern, test, re.IGNORECASE):
            return mode
    raise AssertionError("the last rule matches every id")


def sections(text):
    """The equivalence sections of one log, in order: a dict test -> difference each."""
    found, current = [], None
    for line in text.splitlines():
        if HEADER in line:
            current = {}
            found.append(current)
            continue
        if current is None:
            continue
        match = LINE.match(line.strip())
        if match:
            current[match.group(2)] = max(float(match.group(1)), current.get(match.group(2), 0.0))
        elif line.strip():
            current = None  # the section ended
    return found


def table(columns, labels):
    """Markdown rows: mode, tests per column, largest difference per column."""
    rows = {}
    for index, column in enumerate(columns):
        for test, value in column.items():
            row = rows.setdefault(mode_of(test), [[0, None] for _ in columns])
            row[index][0] += 1
            row[index][1] = value if row[index][1] is None else max(row[index][1], value)
    head = "| Mode | tests (%s) | %s |" % (
        " / ".join(labels), " | ".join("max difference, %s" % label for label in labels))
    lines = [head, "|" + "---|" * (2 + len(labels))]
    for mode, _ in MODES:
        if mode not in rows:
            continue
        counts = " / ".join(str(count) for count, _ in rows[mode])
        values = " | ".join("-" if value is None else "%.3g" % value for _, value in rows[mode])
        lines.append("| %s | %s | %s |" % (mode, counts, values))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("logs", nargs="+", help="pytest output (a CI log holds both legs)")
    parser.add_argument("--labels", nargs="+", help="one per section, in order")
    args = parser.parse_args(argv)
    columns = []
    for path in args.logs:
        with open(path, errors="replace") as handle:
            columns.extend(sections(handle.read()))
    if not columns:
        sys.exit("no section %r in %s" % (HEADER, ", ".join(args.logs)))
    labels = args.labels or ["run %d" % (index + 1) for index in range(len(columns))]
    if len(labels) != len(columns):
        sys.exit("%d labels for %d sections" % (len(labels), len(columns)))
    print(table(columns, labels))


if __name__ == "__main__":
    main()
