"""Where each kernel's warps wait, per SASS instruction, from Nsight Compute.

Reads the source page of an ncu report exported as CSV (optionally gzipped):

    ncu --section WarpStateStats --section SourceCounters -o rep ...
    ncu --import rep.ncu-rep --page source --csv --print-source sass > rep_sass.csv

and prints, per kernel: its stall reasons as shares of all warp samples
(`long_sb`: waiting for a global / local load's data, `wait`: a fixed-latency
dependency, `selected`: issuing, `not_selected`: eligible but another warp
issued); how its executed warp instructions split by execution count (the
step loop's instructions all run the same number of times, a row's setup
once per row); and the instructions with the most samples, with their
three main reasons.

    python tools/ncu_stalls.py REP_sass.csv[.gz] [--kernel SUBSTRING] [--top N]
"""
import argparse
import collections
import csv
import gzip
import re


def read_kernels(path):
    """{kernel name: [row dict per SASS instruction]} (each address once)."""
    opener = gzip.open if path.endswith(".gz") else open
    kernels, name, header = {}, None, None
    with opener(path, "rt", newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                name, header = row[1], None
                kernels.setdefault(name, {})
            elif row[0] == "Address":
                header = row
            elif name is not None and header is not None:
                kernels[name].setdefault(row[0], dict(zip(header, row, strict=False)))
    return {k: list(v.values()) for k, v in kernels.items()}


def number(text):
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return 0.0


def report(name, rows, top):
    reasons = [h for h in rows[0] if h.startswith("stall_") and "Not Issued" not in h]
    totals = collections.Counter()
    for r in rows:
        for h in reasons:
            totals[h] += number(r[h])
    samples = sum(totals.values()) or 1.0
    executed = [number(r["Instructions Executed"]) for r in rows]
    short = re.sub(r"\(.*", "", name).replace("pyg_multihead_agg::<unnamed>::", "")
    print(f"## {short}")
    print(f"{int(samples)} samples, {int(sum(executed))} warp instructions executed")
    print("stalls: " + ", ".join(f"{h[6:]} {100 * v / samples:.1f}%"
                                 for h, v in totals.most_common(8)))
    by_count = collections.Counter()
    for n in executed:
        by_count[int(n)] += n
    total = sum(executed) or 1.0
    print("instructions by execution count:")
    for count, n in sorted(by_count.items(), key=lambda kv: -kv[1])[:6]:
        print(f"  {count:>10d} times x {n / max(count, 1):5.0f} instructions = "
              f"{100 * n / total:5.1f}%")
    print("most sampled instructions:")
    key = "Warp Stall Sampling (All Samples)"
    for r in sorted(rows, key=lambda r: -number(r[key]))[:top]:
        main = sorted(((number(r[h]), h[6:]) for h in reasons), reverse=True)[:3]
        why = ", ".join(f"{h} {int(v)}" for v, h in main if v)
        runs = int(number(r["Instructions Executed"]))
        print(f"  {100 * number(r[key]) / samples:5.1f}%  x{runs:<8d}"
              f" {r['Source'].strip()[:64]:64s} {why}")
    print()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--kernel", default="", help="only kernels whose name contains this")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    for name, rows in read_kernels(args.csv).items():
        if args.kernel in name and rows:
            report(name, rows, args.top)


if __name__ == "__main__":
    main()
