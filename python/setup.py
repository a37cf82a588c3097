"""pip install ./python — builds the shardcache module against the system libraries.

The extension is built by the project's own CMake (SHARDCACHE_PYTHON_ONLY: the client library,
GPU staging when nvcc is present, and the bindings), so pip and `make` compile the same code.
Needs a shardcache source tree around this directory, cmake and the Debian packages
deploy/setup.sh installs for the client (protobuf, spdlog, xxhash, pybind11, dlpack). Offline, use
`pip install --no-build-isolation ./python` so pip takes the system setuptools.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(shardcache VERSION ([0-9.]+)", text).group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        if not (ROOT / "client" / "include" / "shardcache" / "client.h").exists():
            raise RuntimeError("setup.py builds from the shardcache source tree; %s is not in one" % HERE)
        build = Path(self.build_temp).resolve() / "cmake"
        build.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-DSHARDCACHE_PYTHON_ONLY=ON",
                        "-DCMAKE_BUILD_TYPE=RelWithDebInfo"], check=True)
        jobs = str(os.cpu_count() or 2)
        subprocess.run(["cmake", "--build", str(build), "--target", "shardcache_python", "-j", jobs], check=True)
        built = next((build / "python" / "shardcache").glob("_shardcache*.so"))
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)


setup(
    name="shardcache",
    version=project_version(),
    description="Client of shardcached, the node-local cache for remote training datasets",
    packages=["shardcache"],  # pip runs this file from its own directory
    package_data={"shardcache": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("shardcache._shardcache", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    install_requires=["numpy"],
    extras_require={"torch": ["torch"]},
    zip_safe=False,
)
