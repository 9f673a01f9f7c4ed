"""LBANN's real Python front end from an LBANN source tree, without a built
LBANN: what LBANN's own CMake build does for its front end, done here.

LBANN's build (CMakeLists.txt, LBANN_HAS_PYTHON_FRONTEND) compiles the
.proto files of src/proto with protoc, writes lbann_features.py (the
LBANN_HAS_* options it was built with) and a python_config.ini naming the
compiled lbann_pb2.py and the executable, next to python/lbann. This module
does the same into a cache folder, with the protoc on PATH (Debian's
protobuf-compiler), so that ``import lbann`` gives the real front end: its
layers, its model, its trainer, its prototext writer, its launcher with
``setup_only=True``. It cannot train: there is no ``lbann`` executable.

Point it at a source tree with DDLC_LBANN_SOURCE: a checkout, or a git
directory (a bare clone or a mirror; DDLC_LBANN_REF picks the commit,
default HEAD). Nothing of LBANN's is copied into this repository.
"""

from __future__ import annotations

import functools
import hashlib
import io
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from runfiles import variables
from runfiles.atomic import entry_lock

SOURCE_VARIABLE = "DDLC_LBANN_SOURCE"
CONFIG_VARIABLE = "LBANN_PYTHON_CONFIG_FILE"
CACHE = variables.cache("lbann-frontend")


class SourceError(RuntimeError):
    """No usable LBANN source tree, or no protoc: the message says which."""


# Where envs/build-lbann.sh checks LBANN out: a source tree wherever it ran.
BUILD_SCRIPT_TREE = variables.cache("lbann", "src", "LBANN")


def source_tree() -> Path | None:
    """DDLC_LBANN_SOURCE, else the build script's checkout, else None."""
    value = variables.get(SOURCE_VARIABLE)
    if value:
        return Path(value)
    return BUILD_SCRIPT_TREE if (BUILD_SCRIPT_TREE / "src" / "proto").is_dir() else None


def _is_git_dir(path: Path) -> bool:
    return (path / "HEAD").is_file() and (path / "objects").is_dir()


def _ref() -> str:
    """DDLC_LBANN_REF, never read by git as an option (``--output=FILE``
    would have git archive write FILE)."""
    ref = variables.value("DDLC_LBANN_REF")
    if not ref or ref.startswith("-"):
        raise SourceError(
            f"DDLC_LBANN_REF={ref!r}: not a commit, branch or tag name; unset it (HEAD) "
            "or name one, e.g. DDLC_LBANN_REF=v0.104"
        )
    return ref


def _stage(source: Path, folder: Path) -> None:
    """python/ and src/proto/ of the source tree, into folder."""
    if _is_git_dir(source):
        ref = _ref()
        archive = subprocess.run(
            ["git", "-C", str(source), "archive", "--format=tar", ref, "python", "src/proto"],
            capture_output=True,
            check=False,
        )
        if archive.returncode != 0:
            raise SourceError(
                f"{SOURCE_VARIABLE}={source}: git archive {ref} failed: "
                f"{archive.stderr.decode(errors='replace').strip()}"
            )
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(folder)
    else:
        for part in ("python", "src/proto"):
            shutil.copytree(source / part, folder / part)


def _key(source: Path) -> str:
    """The cache folder's name: which tree, which commit."""
    ref = _ref()
    if _is_git_dir(source) or (source / ".git").exists():
        found = subprocess.run(
            ["git", "-C", str(source), "rev-parse", ref], capture_output=True, text=True
        )
        ref = found.stdout.strip() or ref
    return hashlib.sha256(f"{source.resolve()}@{ref}".encode()).hexdigest()[:16]


def prepare(source: Path, cache: Path = CACHE) -> Path:
    """The folder holding an importable ``lbann`` package built from
    ``source``; made once per tree and commit."""
    if not (source.exists() and (_is_git_dir(source) or (source / "src" / "proto").is_dir())):
        raise SourceError(
            f"{SOURCE_VARIABLE}={source}: not an LBANN source tree (no "
            "src/proto) nor a git directory of one; point it at a clone of "
            "https://github.com/LLNL/lbann"
        )
    protoc = shutil.which("protoc")
    if protoc is None:
        raise SourceError(
            "protoc not found: install Debian's protobuf-compiler (or any "
            "protoc 3.x) to compile LBANN's .proto files"
        )
    folder = cache / _key(source)
    if (folder / "ready").exists():
        return folder / "python"
    with entry_lock(folder):  # checkouts share the cache: one makes it, the others wait
        if not (folder / "ready").exists():
            _make(source, protoc, folder)
    return folder / "python"


def _make(source: Path, protoc: str, folder: Path) -> None:
    """``prepare``'s folder, made in a private one and renamed into place."""
    staging = folder.with_name(folder.name + f".{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    _stage(source, staging)
    proto_dir, out = staging / "src" / "proto", staging / "python"
    compiled = subprocess.run(
        [
            protoc,
            f"-I{proto_dir}",
            f"--python_out={out}",
            *sorted(str(p) for p in proto_dir.glob("*.proto")),
        ],
        capture_output=True,
        text=True,
    )
    if compiled.returncode != 0:
        raise SourceError(f"protoc could not compile LBANN's .proto files: {compiled.stderr}")
    package = out / "lbann"
    # As LBANNWritePythonFeatures.cmake writes it, for a build with no LBANN_HAS_* option.
    (package / "lbann_features.py").write_text(
        "lbann_cmake_options = set()\nlbann_features = set()\n\n"
        "def has_feature(feature_name):\n    return feature_name.upper() in lbann_features\n\n"
        "def get_features():\n    return lbann_features\n"
    )
    (package / "python_config.ini").write_text(
        f"[Paths]\nlbann_pb2.py = {folder / 'python' / 'lbann_pb2.py'}\nlbann_exe = lbann\n"
    )
    (staging / "ready").write_text(f"{source}\n")
    shutil.rmtree(folder, ignore_errors=True)  # a damaged one: no ready stamp
    staging.rename(folder)


def import_lbann(source: Path | None = None):
    """``import lbann`` from the prepared source tree (DDLC_LBANN_SOURCE)."""
    source = source or source_tree()
    if source is None:
        raise SourceError(f"{SOURCE_VARIABLE} is not set: point it at an LBANN source tree")
    path = str(prepare(source))
    if path not in sys.path:
        sys.path.insert(0, path)
    # lbann reads its config once, at import. Left in os.environ, this
    # config (executable: a bare 'lbann') would reach every process started
    # later, and a built LBANN's front end there would no longer find its
    # executable.
    with variables.setting(CONFIG_VARIABLE, str(Path(path) / "lbann" / "python_config.ini")):
        return importlib.import_module("lbann")


@functools.cache
def front_end():
    """(lbann module, where it came from): the installed front end, else
    the one of the source tree; (None, why not) when neither is there."""
    try:
        import lbann

        return lbann, f"the installed LBANN front end ({Path(lbann.__file__).parent})"
    except ImportError:
        pass
    source = source_tree()
    if source is None:
        return None, (
            f"LBANN is not importable and no source tree was found (set "
            f"{SOURCE_VARIABLE}, or run envs/build-lbann.sh)"
        )
    try:
        return import_lbann(source), (
            f"LBANN's Python front end from the source tree "
            f"{source} (its .proto files compiled here by protoc)"
        )
    except (SourceError, ImportError) as exc:
        return None, f"LBANN's front end from {source} could not be imported: {exc}"
