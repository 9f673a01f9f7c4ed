"""Applies one of our patches to an upstream source tree: copies our new
files in, then inserts each hook beside its anchor, a short piece of the
upstream text that must occur exactly once. Run again on a patched tree,
it changes nothing.

    python3 envs/patches/apply.py envs/patches/tarantella/GaspiCxx.json SRC_DIR
    python3 envs/patches/apply.py envs/patches/tarantella/gaspi-cleanup.json PREFIX

The spec (JSON): {"files": {our file (relative to the spec): its place in
SRC_DIR}, "hooks": [{"file": F, "anchor": A, "before" or "after": TEXT}]}.
Standard library only: the build scripts run it with any python3.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path


class PatchError(Exception):
    pass


def apply(spec_path: Path, source: Path) -> list[str]:
    """What was done, one line each; PatchError names the file and anchor
    that no longer match the pinned source."""
    spec = json.loads(spec_path.read_text())
    done = []
    for ours, place in spec.get("files", {}).items():
        target = source / place
        target.parent.mkdir(parents=True, exist_ok=True)
        _replace(target, (spec_path.parent / ours).read_text())
        done.append(f"added {place}")
    for hook in spec["hooks"]:
        path = source / hook["file"]
        if not path.exists():
            raise PatchError(f"{path}: not in the source tree (is it the pinned commit?)")
        text = path.read_text()
        anchor = hook["anchor"]
        insert = hook.get("before", hook.get("after"))
        patched = insert + anchor if "before" in hook else anchor + insert
        if patched in text:
            done.append(f"{hook['file']}: already hooked")
            continue
        count = text.count(anchor)
        if count != 1:
            raise PatchError(
                f"{path}: anchor {anchor!r} found {count} times (expected once): "
                "the source is not the commit this patch was written for"
            )
        _replace(path, text.replace(anchor, patched))
        done.append(f"{hook['file']}: hooked at {anchor.strip().splitlines()[0]!r}")
    return done


def _replace(path: Path, text: str) -> None:
    """``path`` holds ``text`` at once, with its mode: a script patched in
    an installed prefix may be running (bash reads a script as it goes). A
    new file, never written into the old one: an installer that links files
    from its cache (uv, envs/setup.sh) shares their inodes with that cache
    and every environment made from it."""
    new = path.with_name(path.name + ".patching")
    new.write_text(text)
    if path.exists():
        shutil.copymode(path, new)
    os.replace(new, path)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        for line in apply(Path(argv[0]), Path(argv[1])):
            print(f"patch: {line}")
    except PatchError as exc:
        print(f"patch {argv[0]}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
