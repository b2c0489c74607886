"""Build ditmem: the Python packages plus the ditmem._C extension from csrc/.

ops/ installs as ditmem.ops and scheduler/ as ditmem.scheduler. CUDA sources under
csrc/cuda/ are compiled only when torch has CUDA and nvcc is present.
Build with the installed torch: ``pip install --no-build-isolation -e .``.
"""

import glob
import os
import shutil

from setuptools import find_packages, setup


def _packages():
    mapping = {"ditmem": "ditmem", "ditmem.ops": "ops", "ditmem.scheduler": "scheduler"}
    packages = []
    for prefix, folder in mapping.items():
        packages.append(prefix)
        packages += [f"{prefix}.{sub}" for sub in find_packages(folder)]
    return sorted(packages), mapping


def _extensions():
    from torch.utils import cpp_extension

    sources = sorted(glob.glob("csrc/*.cpp"))
    cuda_sources = sorted(glob.glob("csrc/cuda/*.cu"))
    import torch

    with_cuda = torch.cuda.is_available() or (
        torch.version.cuda is not None and shutil.which("nvcc") is not None
    )
    cxx = ["-O3", "-std=c++17", "-fopenmp"]
    if os.environ.get("DITMEM_NATIVE", "1") == "1":
        cxx.append("-march=native")
    if with_cuda and cuda_sources:
        return [
            cpp_extension.CUDAExtension(
                "ditmem._C",
                sources + cuda_sources,
                extra_compile_args={"cxx": cxx + ["-DDITMEM_WITH_CUDA"], "nvcc": ["-O3"]},
                extra_link_args=["-fopenmp"],
            )
        ], cpp_extension.BuildExtension
    return [
        cpp_extension.CppExtension(
            "ditmem._C",
            sources,
            extra_compile_args={"cxx": cxx},
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
        "serve": ["fastapi", "uvicorn", "prometheus_client", "httpx", "openai"],
        "triton": ["triton"],
        "npu": ["torch_npu"],
        "nvtx": ["nvtx"],
    },
    entry_points={"console_scripts": ["ditmem=ditmem.cli:main"]},
)
