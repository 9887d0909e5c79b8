"""Builds the one extension, ``pyg_multihead_agg._C``, from csrc/.

Environment switches (as in torch_scatter / torch_sparse):
  FORCE_CUDA=1       build the CUDA kernels even where no GPU is visible
  FORCE_ONLY_CPU=1   build the CPU kernels only
  TORCH_CUDA_ARCH_LIST  architectures to build for (default: the visible
                     GPU's, else 9.0)
  DEBUG=1            -O0 -g, for gdb / compute-sanitizer line numbers
Install with ``pip install --no-build-isolation .`` so that the build uses the
torch that is installed (the C++ ABI must match).
"""
import glob
import os
import sys

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import (
    CUDA_HOME,
    BuildExtension,
    CppExtension,
    CUDAExtension,
)

LIBRARY = "pyg_multihead_agg"
HERE = os.path.dirname(os.path.abspath(__file__))


def with_cuda() -> bool:
    if os.getenv("FORCE_ONLY_CPU", "0") == "1":
        return False
    if os.getenv("FORCE_CUDA", "0") == "1":
        return True
    return torch.version.cuda is not None and CUDA_HOME is not None


def default_arch_list() -> str:
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor}"
    return "9.0"


def openmp_flags() -> list:
    """-fopenmp where torch's ATen runs on OpenMP and the compiler is GCC or
    clang on Linux (torch ships its libgomp; elsewhere the CPU kernels run on
    one thread)."""
    if not sys.platform.startswith("linux") or not torch.backends.openmp.is_available():
        return []
    return ["-fopenmp"]


def extensions():
    debug = os.getenv("DEBUG", "0") == "1"
    cuda = with_cuda()
    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")))
    sources += sorted(glob.glob(os.path.join("csrc", "cpu", "*.cpp")))
    # -g0 overrides the -g of Python's own CFLAGS: debug information for the
    # kernels' many instantiations took a fifth of the build.
    cxx = ["-O0", "-g"] if debug else ["-O3", "-g0"]
    cxx += ["-fdiagnostics-color=always", "-DPy_LIMITED_API=0x030A0000"]
    link = ["-O0", "-g"] if debug else []
    # at::parallel_for is inlined into the CPU kernels: without OpenMP they run
    # on one thread whatever torch.set_num_threads says.
    openmp = openmp_flags()
    cxx += openmp
    link += openmp
    extra_compile_args = {"cxx": cxx}
    extension = CppExtension
    if cuda:
        extension = CUDAExtension
        # One folder per kernel family (csrc/cuda/spmm, attention) and the
        # shared utils; many small .cu files, which ninja builds in parallel.
        sources += sorted(glob.glob(os.path.join("csrc", "cuda", "*", "*.cu")))
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", default_arch_list())
        nvcc = ["-O0", "-g", "-G"] if debug else ["-O3", "-lineinfo"]
        nvcc += ["--expt-relaxed-constexpr", "-DWITH_CUDA"]
        extra_compile_args["nvcc"] = nvcc
        extra_compile_args["cxx"].append("-DWITH_CUDA")
    else:
        sources += [os.path.join("csrc", "no_cuda", "no_cuda.cpp")]
    return [
        extension(
            f"{LIBRARY}._C",
            sources,
            extra_compile_args=extra_compile_args,
            extra_link_args=link,
            py_limited_api=True,
        )
    ]


setup(
    packages=find_packages(include=[LIBRARY, f"{LIBRARY}.*"]),
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
