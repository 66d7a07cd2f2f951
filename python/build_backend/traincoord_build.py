"""The build backend of the traincoord Python package (PEP 517), standard library only.

pip's isolated build installs a package's build requirements first, from an index: with
setuptools that meant a download, so `pip install ./python` failed offline. This backend needs
nothing (``requires = []``), so pip, ``pip wheel`` and ``python3 -m build`` work without a
network, and it writes nothing into the source tree (no build/, no .egg-info).

The package is pure Python: a wheel is the ``traincoord/*.py`` files and a dist-info made from
pyproject.toml's [project] table (name, version, description, requires-python,
optional-dependencies). An editable install (``pip install -e``) is a wheel holding a .pth file
that puts this directory on sys.path.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # python/
PACKAGE = "traincoord"
TAG = "py3-none-any"
# Reproducible archives: the timestamp of SOURCE_DATE_EPOCH, else zip's earliest.
_EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))


def _project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _metadata() -> str:
    p = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}"]
    if "description" in p:
        lines.append(f"Summary: {p['description']}")
    if "requires-python" in p:
        lines.append(f"Requires-Python: {p['requires-python']}")
    for dep in p.get("dependencies", []):
        lines.append(f"Requires-Dist: {dep}")
    for extra, deps in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines.extend(f'Requires-Dist: {dep} ; extra == "{extra}"' for dep in deps)
    return "\n".join(lines) + "\n"


def _dist_name() -> str:
    p = _project()
    return f"{p['name'].replace('-', '_')}-{p['version']}"


def _sources() -> list[Path]:
    """The package's modules, relative to ROOT, in a stable order."""
    return sorted(p.relative_to(ROOT) for p in (ROOT / PACKAGE).rglob("*.py")
                  if "__pycache__" not in p.parts)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _dist_info_files() -> dict[str, bytes]:
    wheel = (f"Wheel-Version: 1.0\nGenerator: traincoord build_backend\n"
             f"Root-Is-Purelib: true\nTag: {TAG}\n")
    return {"METADATA": _metadata().encode(), "WHEEL": wheel.encode(),
            "top_level.txt": f"{PACKAGE}\n".encode()}


def _write_wheel(wheel_directory: str, files: dict[str, bytes]) -> str:
    """Writes a wheel of FILES (archive name -> content) plus its dist-info; returns its name."""
    dist = _dist_name()
    info = f"{dist}.dist-info"
    files = dict(files)
    files.update({f"{info}/{k}": v for k, v in _dist_info_files().items()})
    record = [_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    name = f"{dist}-{TAG}.whl"
    os.makedirs(wheel_directory, exist_ok=True)
    stamp = time.gmtime(max(_EPOCH, 315532800))[:6]
    with zipfile.ZipFile(Path(wheel_directory) / name, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files.items():
            entry = zipfile.ZipInfo(n, date_time=stamp)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(entry, d)
    return name


# --- PEP 517 ------------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None) -> list[str]:
    return []


def get_requires_for_build_sdist(config_settings=None) -> list[str]:
    return []


def get_requires_for_build_editable(config_settings=None) -> list[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None) -> str:
    info = Path(metadata_directory) / f"{_dist_name()}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    for name, data in _dist_info_files().items():
        (info / name).write_bytes(data)
    return info.name


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None) -> str:
    return prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    return _write_wheel(wheel_directory,
                        {p.as_posix(): (ROOT / p).read_bytes() for p in _sources()})


def build_editable(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    return _write_wheel(wheel_directory, {f"__editable__.{PACKAGE}.pth": f"{ROOT}\n".encode()})


def build_sdist(sdist_directory, config_settings=None) -> str:
    dist = _dist_name()
    members = [Path("pyproject.toml"), Path("build_backend/traincoord_build.py"), *_sources()]
    name = f"{dist}.tar.gz"
    os.makedirs(sdist_directory, exist_ok=True)
    with tarfile.open(Path(sdist_directory) / name, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        def add(arcname: str, data: bytes) -> None:
            entry = tarfile.TarInfo(f"{dist}/{arcname}")
            entry.size, entry.mtime, entry.mode = len(data), _EPOCH, 0o644
            tar.addfile(entry, io.BytesIO(data))
        add("PKG-INFO", _metadata().encode())
        for p in members:
            add(p.as_posix(), (ROOT / p).read_bytes())
    return name
