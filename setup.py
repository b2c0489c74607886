"""Build ditmem: the Python packages plus the ditmem._C extension from csrc/.

ops/ installs as ditmem.ops and scheduler/ as ditmem.scheduler. ditmem._C holds CPU kernels
only (C++ with OpenMP); GPU kernels are Triton (ops/triton/), compiled at run time.
Build with the installed torch: ``pip install --no-build-isolation -e .``. The flags are
portable (``-O3``, no ``-march``); ``DITMEM_NATIVE=1`` adds ``-march=native`` for a build that
only runs on CPUs like the one it was built on.
"""

import glob
import os

from setuptools import find_packages, setup


def _packages():
    mapping = {"ditmem": "ditmem", "ditmem.ops": "ops", "ditmem.scheduler": "scheduler"}
    packages = []
    for prefix, folder in mapping.items():
        packages.append(prefix)
        packages += [f"{prefix}.{sub}" for sub in find_packages(folder)]
    return sorted(packages), mapping


def compile_flags(environ=os.environ) -> list[str]:
    """C++ flags for ditmem._C: portable unless ``DITMEM_NATIVE=1``."""
    cxx = ["-O3", "-std=c++17", "-fopenmp"]
    if environ.get("DITMEM_NATIVE", "0") == "1":
        cxx.append("-march=native")
    return cxx


def _extensions():
    from torch.utils import cpp_extension

    return [
        cpp_extension.CppExtension(
            "ditmem._C",
            sorted(glob.glob("csrc/*.cpp")),
            extra_compile_args={"cxx": compile_flags()},
            extra_link_args=["-fopenmp"],
        )
    ], cpp_extension.BuildExtension


packages, package_dir = _packages()
ext_modules, build_ext = _extensions()

setup(
    name="ditmem",
    version="0.1.0",
    description="Paged memory, ragged paged attention and an SLO-aware step scheduler "
    "for serving diffusion transformers",
    python_requires=">=3.10",
    packages=packages,
    package_dir=package_dir,
    package_data={"ditmem.scheduler": ["profiles/*.json"]},
    ext_modules=ext_modules,
    cmdclass={"build_ext": build_ext.with_options(use_ninja=True)},
    # torch is not pinned: CPU machines install torch==2.13.0 first (scripts/setup_env.sh),
    # GPU users keep whatever CUDA/NPU build they have.
    install_requires=[
        "torch>=2.4",
        "numpy",
        "einops",
        "diffusers>=0.35",
        "accelerate",
        "transformers>=4.51",
        "tokenizers",
        "tqdm",
        "rich",
        "matplotlib",
    ],
    extras_require={
        "dev": ["pytest", "hypothesis", "ruff", "pytest-timeout"],
        "serve": ["fastapi", "uvicorn", "prometheus_client", "httpx", "openai",
                  "python-multipart", "av"],  # forms; MP4 (PyAV ships libx264)
        "triton": ["triton"],
        "npu": ["torch_npu"],
        "nvtx": ["nvtx"],
        "ray": ["ray[serve]>=2.40"],
        "bounds": ["scipy>=1.11"],  # scheduler.exact_bound (HiGHS MILP)
    },
    entry_points={"console_scripts": ["ditmem=ditmem.cli:main"]},
)
