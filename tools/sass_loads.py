"""How many global loads each CUDA kernel keeps in flight, read from its SASS.

Compiles a .cu file of csrc/cuda for sm_90 (the flags of setup.py; no GPU
needed) or takes an object file, disassembles it with ``cuobjdump -sass`` and
prints, per kernel, its registers and spill (ptxas), the number of 16-byte
loads (``LDG.E.128``, the feature-row gathers) and how many other 16-byte
loads issue between each of them and the first instruction that reads its
result. An unrolled step of U gathers, all issued before any is used, averages
(U - 1) / 2 (3.5 for U = 8); gathers that wait for one another average 0
(e.g. a branch per load, with half-precision unpacking inside it).
``--width any --in-loops`` counts every global load inside an innermost loop
and how many of them are used with no other load in flight (a loop such as
``s += part[k]`` that makes one round trip per slot). A one-load remainder
loop is not flagged: read the SASS for those.

    python tools/sass_loads.py csrc/cuda/spmm/gather_fp32_fp64.cu --filter "gather_kernel<float"
    python tools/sass_loads.py --obj build/.../forward_rows_fp32_fp64.o
    python tools/sass_loads.py --obj build/.../forward_rows_fp32_fp64.o --width any --in-loops

Needs nvcc (CUDA 12.x/13.x) and cuobjdump: from PATH, $CUDA_HOME/bin, or the
PyPI wheel ``nvidia-cuda-cuobjdump`` (``pip install nvidia-cuda-cuobjdump``;
its binary lies under ``nvidia/cu13/bin``). On a CPU-only torch, the one
header that only CUDA builds of torch ship is stubbed.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_tool(name):
    path = shutil.which(name)
    if path:
        return path
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidates = [os.path.join(cuda, "bin", name)]
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        candidates += glob.glob(os.path.join(site, "nvidia", "cu*", "bin", name))
    for c in candidates:
        if os.path.exists(c):
            return c
    sys.exit(f"{name} not found: put it on PATH, set CUDA_HOME, or "
             f"pip install nvidia-cuda-{name}")


def compile_cu(source, workdir, defines=()):
    import torch.utils.cpp_extension as ext

    includes = ext.include_paths()
    header = os.path.join("c10", "cuda", "impl", "cuda_cmake_macros.h")
    if not any(os.path.exists(os.path.join(p, header)) for p in includes):  # a CPU-only torch
        stub = os.path.join(workdir, "stub")
        os.makedirs(os.path.dirname(os.path.join(stub, header)), exist_ok=True)
        with open(os.path.join(stub, header), "w") as f:
            f.write("#define C10_CUDA_BUILD_SHARED_LIBS\n")
        includes = includes + [stub]
    obj = os.path.join(workdir, os.path.basename(source) + ".o")
    cmd = [find_tool("nvcc"), "-std=c++17", "-O3", "-arch=sm_90", "--expt-relaxed-constexpr",
           "-DWITH_CUDA", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
           "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
           "-D_GLIBCXX_USE_CXX11_ABI=1", "-Xptxas", "-v", "-c", source, "-o", obj]
    cmd += ["-I" + p for p in includes] + ["-D" + d for d in defines]
    print("compiling", os.path.relpath(source, ROOT), "(1-3 minutes) ...", file=sys.stderr)
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(run.stderr[-3000:])
    return obj, run.stderr


def ptxas_usage(log):
    usage, name = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            name = m.group(1)
        m = re.search(r"(\d+) bytes spill stores", line)
        if m and name:
            spill = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            usage[name] = (int(m.group(1)), spill)
            name = None
    return usage


def registers_read(operands):
    regs = set()
    for m in re.finditer(r"(?<![\w])R(\d+)(\.64)?", operands):
        regs.add(int(m.group(1)))
        if m.group(2):
            regs.add(int(m.group(1)) + 1)
    return regs


def loop_ranges(ins):
    """(start, end) addresses of the innermost loops: the bodies of backward
    branches that hold no other such body (a persistent kernel's row loop
    holds everything)."""
    ranges = []
    for addr, text in ins:
        m = re.search(r"BRA\s+.*?0x([0-9a-f]+)", text)
        if m and "DIV" not in text and int(m.group(1), 16) < addr:
            ranges.append((int(m.group(1), 16), addr))
    return [(a, b) for a, b in ranges
            if not any((c, d) != (a, b) and a <= c and d <= b for c, d in ranges)]


def gathers_in_flight(body, width="128", in_loops=False):
    """For each global load of the given width (LDG.E.128, or any LDG with
    width "any"), the other such loads issued before its result is read
    (instructions in address order, branches ignored). in_loops: only the
    loads inside an innermost loop."""
    ins = [(int(a, 16), t) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", body)]
    loops = loop_ranges(ins) if in_loops else None
    pending, counts = [], []
    for addr, ins_text in ins:
        ins_text = re.sub(r"^@!?U?P\w+\s+", "", ins_text.strip())
        op = ins_text.split()[0]
        operands = ins_text[len(op):]
        if op.startswith(("ST", "RED", "ATOM")):
            read = registers_read(operands)
        else:
            read = registers_read(operands.split(",", 1)[1]) if "," in operands else set()
        still = []
        for regs, n in pending:
            (counts.append(n) if regs & read else still.append([regs, n]))
        pending = still
        # LDGSTS (cp.async) writes shared memory, not registers: its wait is a
        # DEPBAR, so it is not counted here.
        is_load = op.startswith("LDG.E.128") if width == "128" else (
            op.startswith("LDG") and not op.startswith(("LDGSTS", "LDGDEPBAR")))
        if is_load and (loops is None or any(a <= addr <= b for a, b in loops)):
            for p in pending:
                p[1] += 1
            size = 4 if ".128" in op else 2 if ".64" in op else 1
            first = int(re.search(r"R(\d+)", operands).group(1))
            pending.append([set(range(first, first + size)), 0])
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", help="a .cu file (compiled for sm_90)")
    parser.add_argument("--obj", help="an object file instead of a source")
    parser.add_argument("--filter", default="", help="only kernels whose name contains this")
    parser.add_argument("-D", dest="defines", action="append", default=[],
                        help="a macro for nvcc (e.g. -D PMA_BACKWARD_ENTRIES=4), repeatable")
    parser.add_argument("--width", choices=["128", "any"], default="128",
                        help="which global loads: 16-byte ones (the row gathers) or all")
    parser.add_argument("--in-loops", action="store_true",
                        help="only the loads inside innermost loops (backward branches)")
    args = parser.parse_args()
    if not args.source and not args.obj:
        parser.error("give a .cu file or --obj")
    with tempfile.TemporaryDirectory() as work:
        usage = {}
        obj = args.obj
        if obj is None:
            obj, log = compile_cu(os.path.abspath(args.source), work, args.defines)
            usage = ptxas_usage(log)
        sass = subprocess.run([find_tool("cuobjdump"), "-sass", obj], capture_output=True,
                              text=True, check=True).stdout
    names = re.split(r"\n\s+Function : ", sass)[1:]
    demangled = subprocess.run(["c++filt"], input="\n".join(n.split("\n", 1)[0].strip()
                                                          for n in names),
                               capture_output=True, text=True).stdout.splitlines()
    what = "16-byte loads" if args.width == "128" else "global loads"
    print(f"| kernel | registers | spill bytes | {what} | mean others in flight | "
          "used with none in flight |")
    print("|---|---|---|---|---|---|")
    for body, name in zip(names, demangled, strict=True):
        mangled = body.split("\n", 1)[0].strip()
        name = name.replace("pyg_multihead_agg::(anonymous namespace)::", "")
        name = name.replace("c10::", "")
        if args.filter not in name:
            continue
        counts = gathers_in_flight(body, args.width, args.in_loops)
        regs, spill = usage.get(mangled, ("-", "-"))
        mean = f"{sum(counts) / len(counts):.1f}" if counts else "-"
        short = re.sub(r"\(.*", "", name)
        serial = sum(1 for n in counts if n == 0)
        print(f"| `{short}` | {regs} | {spill} | {len(counts)} | {mean} | {serial} |")


if __name__ == "__main__":
    main()
