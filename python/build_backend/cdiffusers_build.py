"""The in-tree PEP 517 build backend of pyproject.toml: `pip install .` / `pip wheel .` build the
extension cdiffusers._cdiffusers with CMake (target cdf_python_module) and pack it with the
pure-Python files of python/cdiffusers into a cp311-abi3 wheel. Nothing is downloaded.

The CMake build folder: $CDIFFUSERS_PY_BUILD_DIR when set (e.g. `build`, the quick start's: an
already configured folder is only brought up to date, so nothing is compiled twice), else
build-python/ in the source tree, configured here (Release, -DCDIFFUSERS_PYTHON=ON, this Python)."""
import base64
import hashlib
import os
import subprocess
import sys
import sysconfig
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME, VERSION = "cdiffusers", "0.1.0"
SUMMARY = ("diffusers' text-to-image pipelines (FLUX.1, SD3 / SD3.5, FLUX.2) on the cdiffusers C library, "
           "without PyTorch")


def _module():
    """Build the extension; returns the path of _cdiffusers.abi3.so."""
    build = os.environ.get("CDIFFUSERS_PY_BUILD_DIR") or os.path.join(ROOT, "build-python")
    build = os.path.abspath(os.path.join(ROOT, build))
    if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DCDIFFUSERS_PYTHON=ON",
                               "-DPython3_EXECUTABLE=" + sys.executable], stdout=sys.stderr)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    subprocess.check_call(["cmake", "--build", build, "--target", "cdf_python_module", "-j", jobs], stdout=sys.stderr)
    so = os.path.join(build, "python", "cdiffusers", "_cdiffusers.abi3.so")
    if not os.path.exists(so):
        raise RuntimeError(f"{so} was not built: are CPython's headers installed (apt install python3-dev)?")
    return so


def _tag():
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"cp311-abi3-{plat}"


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\nSummary: {SUMMARY}\n"
            "Requires-Python: >=3.11\n")


def _dist_info(directory):
    d = os.path.join(directory, f"{NAME}-{VERSION}.dist-info")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(_metadata())
    return os.path.basename(d)


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _dist_info(metadata_directory)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    so = _module()
    src = os.path.join(ROOT, "python", "cdiffusers")
    files = [(os.path.join(src, f), f"cdiffusers/{f}") for f in sorted(os.listdir(src))
             if f.endswith((".py", ".pyi")) or f == "py.typed"]
    files.append((so, "cdiffusers/_cdiffusers.abi3.so"))
    info = f"{NAME}-{VERSION}.dist-info"
    extra = {f"{info}/METADATA": _metadata().encode(),
             f"{info}/WHEEL": (f"Wheel-Version: 1.0\nGenerator: cdiffusers_build\nRoot-Is-Purelib: false\n"
                               f"Tag: {_tag()}\n").encode()}
    name = f"{NAME}-{VERSION}-{_tag()}.whl"
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        def add(arc, data):
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")
        for path, arc in files:
            with open(path, "rb") as f:
                add(arc, f.read())
        for arc, data in extra.items():
            add(arc, data)
        record.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return name
