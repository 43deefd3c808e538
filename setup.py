"""Thin setuptools driver: CMake builds libzenflow and zenflow._C (CMakeLists.txt).

Only the library and the Python module are built here: the C++ tests are built by
tests/run_all.sh. `pip install -v .` shows the CMake and ninja output as it comes; each phase
also announces itself with one "zenflow:" line on stderr.

Environment:
  ZENFLOW_BUILD_DIR   CMake build directory (default: build-cmake/<python tag>); keeping it
                      makes editable reinstalls incremental.
  ZENFLOW_WITH_CUDA   AUTO (default: CUDA when nvcc is found and a GPU is visible) / 1 / 0.
  ZENFLOW_CUDA_ARCHS  CUDA architectures, e.g. "90" (default: the visible GPUs'; with
                      ZENFLOW_WITH_CUDA=1 and no GPU, "80-real;90"). Setting it compiles CUDA.
  ZENFLOW_BUILD_TYPE  CMake build type (default Release).
  CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: ninja's, about the core count).
"""

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
LIBRARY = "libzenflow.so"


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


def _phase(message: str) -> None:
    # stderr, unbuffered: pip -v interleaves it with CMake's output in the right order.
    print(f"zenflow: {message}", file=sys.stderr, flush=True)


def _cuda_build_note(build_dir: Path) -> str:
    """Why this build has no CUDA (CMakeLists.txt's ZENFLOW_CUDA_BUILD_NOTE), or ""."""
    cache = build_dir / "CMakeCache.txt"
    if not cache.exists():
        return ""
    for line in cache.read_text().splitlines():
        if line.startswith("ZENFLOW_CUDA_BUILD_NOTE:"):
            return line.partition("=")[2]
    return ""


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        import pybind11

        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        # One build directory per interpreter: a venv's Python must not reuse another's cache.
        prefix_id = hashlib.sha1(sys.prefix.encode()).hexdigest()[:8]
        tag = f"py{sys.version_info.major}{sys.version_info.minor}-{sysconfig.get_platform()}-{prefix_id}"
        build_dir = Path(os.environ.get("ZENFLOW_BUILD_DIR", ROOT / "build-cmake" / tag))
        build_dir.mkdir(parents=True, exist_ok=True)
        config = [
            "cmake",
            "-S",
            str(ROOT),
            "-B",
            str(build_dir),
            "-G",
            "Ninja",
            f"-DCMAKE_BUILD_TYPE={os.environ.get('ZENFLOW_BUILD_TYPE', 'Release')}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            "-DZENFLOW_BUILD_PYTHON=ON",
            "-DZENFLOW_BUILD_TESTS=OFF",
            # One libzenflow.so beside _C, no versioned file and symlinks (CMakeLists.txt).
            "-DZENFLOW_VERSIONED_SONAME=OFF",
        ]
        # pip's isolated build environment is a new temporary folder each time: name this
        # run's ninja, or the kept build directory would call the last (deleted) one.
        ninja = shutil.which("ninja")
        if ninja:
            config.append(f"-DCMAKE_MAKE_PROGRAM={ninja}")
        started = time.monotonic()
        _phase(f"configuring with CMake in {build_dir}")
        subprocess.run(config, check=True)
        _phase("compiling libzenflow and zenflow._C with ninja (pip install -v . shows each step)")
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "_C"], check=True)
        _phase(f"native build done in {time.monotonic() - started:.0f} s; packaging")
        note = _cuda_build_note(build_dir)
        if note:
            _phase(
                f"built WITHOUT CUDA: {note}. CUDA tensors will be refused; see `python -m zenflow info`"
            )

    # libzenflow.so sits next to _C (found through its $ORIGIN rpath). A wheel takes the whole
    # build directory; the in-place (editable) copy must be told about the library.
    def _library_path(self) -> Path:
        return Path(self.get_ext_fullpath("zenflow._C")).resolve().parent / LIBRARY

    def copy_extensions_to_source(self) -> None:
        inplace, self.inplace = self.inplace, False
        built = self._library_path()
        self.inplace = inplace
        super().copy_extensions_to_source()
        package_dir = self.get_finalized_command("build_py").get_package_dir("zenflow")
        self.copy_file(str(built), os.path.join(package_dir, LIBRARY), level=self.verbose)

    def get_outputs(self) -> list:
        return [*super().get_outputs(), str(self._library_path())]


setup(
    packages=["zenflow", "zenflow.ops", "zenflow.bench", "zenflow.integrations"],
    package_dir={"": "python"},
    ext_modules=[CMakeExtension("zenflow._C")],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
