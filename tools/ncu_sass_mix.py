#!/usr/bin/env python3
"""Summarises an Nsight Compute source page of one kernel by SASS opcode.

Usage: ncu --section SourceCounters --section WarpStateStats --page source --csv \
           --print-source sass -k regex:KERNEL --launch-count 1 PROGRAM ... > src.csv
       tools/ncu_sass_mix.py src.csv

Prints the executed warp instructions and the stall samples per opcode (the
predicate and the modifiers stripped) and the 30 lines with the most stall
samples. The full page of a large kernel is tens of megabytes; this keeps what
a decision needs.
"""
import collections
import csv
import re
import sys


def column(header, prefix):
    for i, name in enumerate(header):
        if name.startswith(prefix):
            return i
    sys.exit("no column starting with %r in the source page" % prefix)


def main(path):
    rows = list(csv.reader(open(path, errors="replace")))
    at = next((i for i, r in enumerate(rows) if "Source" in r), None)
    if at is None:
        sys.exit("%s: no source table (was --page source --csv used?)" % path)
    header = rows[at]
    c_src = column(header, "Source")
    c_exe = column(header, "Instructions Executed")
    c_stall = column(header, "Warp Stall Sampling (All")
    executed, stalls, lines = collections.Counter(), collections.Counter(), []
    for r in rows[at + 1:]:
        if len(r) <= max(c_src, c_exe, c_stall) or r[c_src] == "Source":
            continue
        try:
            n, st = float(r[c_exe] or 0), float(r[c_stall] or 0)
        except ValueError:
            continue
        sass = r[c_src].strip()
        words = re.sub(r"^@!?U?P\w+\s+", "", sass).split()
        op = words[0].split(".")[0] if words else "?"
        executed[op] += n
        stalls[op] += st
        lines.append((st, n, sass))
    total, total_st = sum(executed.values()), max(sum(stalls.values()), 1)
    print("total warp instructions %.0f, stall samples %.0f" % (total, sum(stalls.values())))
    for op, n in executed.most_common(28):
        print("%-10s %10.0f %5.1f%%  stalls %5.1f%%" % (op, n, 100 * n / total, 100 * stalls[op] / total_st))
    print("top stall lines:")
    for st, n, sass in sorted(lines, reverse=True)[:30]:
        print("%7.0f %8.0f  %s" % (st, n, sass[:110]))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
