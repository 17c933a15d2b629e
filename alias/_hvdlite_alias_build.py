"""PEP 517/660 build backend of the ``hvdlite-horovod-alias`` distribution.

It writes the wheel itself (a pure-Python package, ``src/horovod``) and so needs nothing
from PyPI. Before a wheel for installing is built it asks the Python environment being
installed into, and refuses (the build fails with a message) if a real Horovod is
installed there (its ``horovod`` distribution, or a ``horovod`` package that is not this
alias): the alias would shadow it or overwrite its files.

Which environment: pip runs this backend with the interpreter it installs for, but,
with build isolation (its default), under ``PYTHONPATH``/``PYTHONNOUSERSITE`` settings
that hide that interpreter's site-packages. The check therefore starts a fresh process
of the same interpreter without those two variables, which sees what a script run with
that interpreter would import: its site-packages, the user site, and a
``--system-site-packages`` venv's base packages. (``pip install --target DIR`` and
``--prefix`` still check the interpreter's own environment; front ends that build in a
venv of their own, such as ``python -m build`` and uv, have the check look at that
venv.) The alias checks again when it is imported, wherever it was installed, and
says so there if hvdlite itself is missing.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_SOURCE = _HERE / "src"

# Run by the target interpreter with a clean module search path; prints what it finds.
_PROBE = r"""
import importlib.metadata, importlib.util, json, os, sys
sys.path[:] = [p for p in sys.path if p]  # not the working directory: the alias's own source may be there
found = {"executable": sys.executable, "dist": None, "package": None}
try:
    d = importlib.metadata.distribution("horovod")
    found["dist"] = [d.metadata["Name"], d.version, str(getattr(d, "_path", ""))]
except importlib.metadata.PackageNotFoundError:
    pass
spec = importlib.util.find_spec("horovod")
if spec is not None:
    folders = list(spec.submodule_search_locations or [])
    if not any(os.path.isfile(os.path.join(f, "_hvdlite_alias.py")) for f in folders):
        found["package"] = spec.origin or ", ".join(folders)
print(json.dumps(found))
"""


def _target_environment() -> dict | None:
    """What the interpreter being installed for imports, or None if it cannot be asked."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                              timeout=120)
        return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def _refuse_unfit_environment() -> None:
    found = _target_environment()
    if found is None:
        sys.stderr.write("hvdlite-horovod-alias: could not check the target environment for a real "
                         "Horovod; the alias checks again when imported\n")
        return
    if found["dist"]:
        name, version, where = found["dist"]
        problem = (f"a real Horovod is installed there ({name} {version}{f', {where}' if where else ''}); "
                   "the alias would shadow it or overwrite its files. Uninstall it first "
                   "(pip uninstall horovod) if you mean to replace it by hvdlite")
    elif found["package"]:
        problem = (f"a horovod package that is not hvdlite's alias is importable there ({found['package']}); "
                   "the alias would shadow it or be shadowed by it. Remove it first")
    else:
        return
    raise SystemExit(f"hvdlite-horovod-alias refuses to install into the environment of "
                     f"{found['executable']}: {problem}.")


def _project() -> dict[str, str]:
    """The simple string keys of pyproject.toml's [project] table (this file's own, whose
    keys are all one-line strings; no TOML parser is needed for them)."""
    text = (_HERE / "pyproject.toml").read_text()
    table = re.search(r"^\[project\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M)
    assert table, "pyproject.toml has no [project] table"
    return dict(re.findall(r'^([A-Za-z-]+)\s*=\s*"([^"]*)"\s*$', table.group(1), re.M))


def _names() -> tuple[str, str]:
    project = _project()
    return re.sub(r"[-_.]+", "_", project["name"]).lower(), project["version"]


def _metadata() -> str:
    project = _project()
    return (f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
            f"Summary: {project['description']}\nLicense: Apache-2.0\n"
            f"Requires-Python: {project['requires-python']}\n")


def _package_files() -> list[tuple[str, bytes]]:
    files = []
    for path in sorted((_SOURCE / "horovod").rglob("*.py")):
        if "__pycache__" not in path.parts:
            files.append((path.relative_to(_SOURCE).as_posix(), path.read_bytes()))
    return files


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory: str, files: list[tuple[str, bytes]]) -> str:
    name, version = _names()
    dist_info = f"{name}-{version}.dist-info"
    files = files + [
        (f"{dist_info}/METADATA", _metadata().encode()),
        (f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: _hvdlite_alias_build\n"
                               b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
        (f"{dist_info}/top_level.txt", b"horovod\n"),
    ]
    record = "\n".join([_record_line(a, d) for a, d in files] + [f"{dist_info}/RECORD,,", ""])
    files.append((f"{dist_info}/RECORD", record.encode()))
    wheel_name = f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(Path(wheel_directory) / wheel_name, "w", zipfile.ZIP_DEFLATED) as whl:
        for arcname, data in files:
            info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(info, data)
    return wheel_name


# PEP 517 hooks.

def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    _refuse_unfit_environment()
    return []


def get_requires_for_build_editable(config_settings: dict | None = None) -> list[str]:
    _refuse_unfit_environment()
    return []


def get_requires_for_build_sdist(config_settings: dict | None = None) -> list[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: dict | None = None,
                metadata_directory: str | None = None) -> str:
    _refuse_unfit_environment()
    return _write_wheel(wheel_directory, _package_files())


def build_editable(wheel_directory: str, config_settings: dict | None = None,
                   metadata_directory: str | None = None) -> str:
    """A wheel whose .pth file puts this checkout's ``src`` folder on ``sys.path``."""
    _refuse_unfit_environment()
    name, version = _names()
    return _write_wheel(wheel_directory, [(f"__editable__.{name}-{version}.pth", f"{_SOURCE}\n".encode())])


def build_sdist(sdist_directory: str, config_settings: dict | None = None) -> str:
    name, version = _names()
    base = f"{name}-{version}"
    members = [("PKG-INFO", _metadata().encode()), ("pyproject.toml", (_HERE / "pyproject.toml").read_bytes()),
               ("_hvdlite_alias_build.py", Path(__file__).read_bytes())]
    members += [(f"src/{arcname}", data) for arcname, data in _package_files()]
    sdist_name = f"{base}.tar.gz"
    with tarfile.open(Path(sdist_directory) / sdist_name, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for arcname, data in members:
            info = tarfile.TarInfo(f"{base}/{arcname}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return sdist_name
