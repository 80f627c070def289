"""Fetch the widget scripts the built site serves itself, from the npm registry.

Reads ``tools/web_assets.json`` (pinned versions and the sha512 integrity of each
registry tarball), downloads each tarball with ``npm pack``, checks its sha512
against the pinned value, and extracts the listed files into ``_static_vendor/static/``
(ignored by git; ``_static_vendor/manifest.json`` records their sha256). The Sphinx
extension ``tools/course_site.py`` then copies them into ``_build/html/_static/``
and points myst-nb's ``nb_ipywidgets_js`` at them.

Without npm (or without the registry) the script prints a notice and exits 0: the
book then builds with the CDN defaults. With ``CI=true`` that is an error (exit 1),
so CI always builds the self-contained site. An integrity mismatch is always an error.

Usage: ``python tools/fetch_assets.py`` (``make assets``; ``make html`` runs it).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "tools" / "web_assets.json"
MANIFEST = "manifest.json"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def sri_sha512(path: Path) -> str:
    """The Subresource-Integrity string npm uses: ``sha512-<base64 digest>``."""
    digest = hashlib.sha512(path.read_bytes()).digest()
    return "sha512-" + base64.b64encode(digest).decode("ascii")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def up_to_date(dest: Path, lock_digest: str) -> bool:
    """True when ``dest`` holds exactly the files of this lock, unchanged since extraction."""
    manifest = dest / MANIFEST
    if not manifest.is_file():
        return False
    data = json.loads(manifest.read_text())
    if data.get("lock_sha256") != lock_digest:
        return False
    return all(
        (dest / "static" / rel).is_file() and sha256(dest / "static" / rel) == digest
        for rel, digest in data["files"].items()
    )


def give_up(reason: str, dest: Path) -> int:
    """No npm or no registry: fall back to the CDN scripts, except in CI."""
    if in_ci():
        print(f"fetch_assets: ERROR: {reason}. CI must build the self-contained site.",
              file=sys.stderr)
        return 1
    shutil.rmtree(dest, ignore_errors=True)  # never serve files of another lock
    print(f"fetch_assets: NOTICE: {reason}.\n"
          "  The site will load require.js and the ipywidgets manager from public CDNs\n"
          "  (MathJax is still served locally). Install Node.js/npm and rebuild for a\n"
          "  site that works fully offline.")
    return 0


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
        raise RuntimeError(f"{tarball.name}: no file matches {missing}; update {LOCK.name}")
    return written


def main() -> int:
    lock_bytes = LOCK.read_bytes()
    lock = json.loads(lock_bytes)
    lock_digest = hashlib.sha256(lock_bytes).hexdigest()
    dest = ROOT / lock["dest"]
    if up_to_date(dest, lock_digest):
        print(f"fetch_assets: {dest.relative_to(ROOT)}/ is up to date")
        return 0

    npm = shutil.which("npm")
    if npm is None:
        return give_up("npm was not found", dest)

    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp) / "vendor"
        served = staging / "static"  # the part Sphinx copies into _build/html/_static/
        files: dict[str, str] = {}
        for pkg in lock["packages"]:
            spec = f"{pkg['name']}@{pkg['version']}"
            try:
                tarball, npm_integrity = npm_pack(npm, spec, Path(tmp))
            except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as err:
                return give_up(f"could not fetch {spec} ({err})", dest)
            actual = sri_sha512(tarball)
            if actual != pkg["integrity"] or npm_integrity not in ("", actual):
                print(f"fetch_assets: ERROR: integrity mismatch for {spec}:\n"
                      f"  pinned {pkg['integrity']}\n  got    {actual}", file=sys.stderr)
                return 1
            for path in extract(tarball, pkg["files"], served / pkg["into"]):
                files[path.relative_to(served).as_posix()] = sha256(path)
            print(f"fetch_assets: {spec} verified ({actual[:23]}...)")
        manifest = {"lock_sha256": lock_digest, "files": dict(sorted(files.items()))}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        shutil.move(staging, dest)
    size = sum((dest / "static" / rel).stat().st_size for rel in files)
    print(f"fetch_assets: {len(files)} files, {size / 1e6:.1f} MB in {dest.relative_to(ROOT)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
