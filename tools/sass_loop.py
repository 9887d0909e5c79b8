"""Instructions per unrolled step of each kernel's hot loop, from its SASS.

Compiles a .cu file of csrc/cuda for sm_90 with setup.py's flags (as
tools/sass_loads.py, whose helpers it uses), disassembles it, and for every
kernel whose demangled name matches --filter prints the smallest loop (a
backward branch and its body) that holds --gathers 16-byte loads, i.e. one
unrolled step, with its instruction count and opcode histogram (e.g. the
per-entry overhead of one kernel variant against another).

    python tools/sass_loop.py csrc/cuda/spmm/gather_fp32_fp64.cu --filter "gather_kernel<float, int"
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_loads  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a .cu file (compiled for sm_90)")
    parser.add_argument("--filter", default="", help="only kernels whose name contains this")
    parser.add_argument("--gathers", type=int, default=8, help="16-byte loads per step")
    parser.add_argument("-D", dest="defines", action="append", default=[],
                        help="a macro for nvcc, repeatable")
    args = parser.parse_args()
    work = tempfile.mkdtemp()
    obj, log = sass_loads.compile_cu(os.path.abspath(args.source), work, args.defines)
    usage = sass_loads.ptxas_usage(log)
    sass = subprocess.run([sass_loads.find_tool("cuobjdump"), "-sass", obj],
                          capture_output=True, text=True, check=True).stdout
    for func in re.split(r"\n\s*Function : ", sass)[1:]:
        mangled = func.split("\n", 1)[0].strip()
        name = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip()
        if args.filter not in name:
            continue
        ins = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]+);", func)
        addr = [int(a, 16) for a, _ in ins]
        best = None
        for i, (_, text) in enumerate(ins):
            m = re.search(r"BRA\s+.*?0x([0-9a-f]+)", text)
            if not m or int(m.group(1), 16) >= addr[i]:
                continue
            body = [t for a, t in zip(addr, (t for _, t in ins), strict=True)
                    if int(m.group(1), 16) <= a <= addr[i]]
            gathers = sum(1 for t in body if re.search(r"LDG\.E[.A-Z0-9]*\.128", t))
            if gathers == args.gathers and (best is None or len(body) < len(best)):
                best = body
        if best is None:
            print(f"{name}: no loop with {args.gathers} 16-byte loads")
            continue
        ops = Counter((t.split()[1] if t.startswith("@") else t.split()[0]).split(".")[0]
                      for t in best)
        top = ", ".join(f"{op} {n}" for op, n in ops.most_common(10))
        regs, spill = usage.get(mangled, (0, 0))
        print(f"{name}\n  {len(best)} instructions per step ({regs} registers, {spill} bytes "
              f"spilled): {top}")


if __name__ == "__main__":
    main()
