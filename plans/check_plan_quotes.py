"""Check that every "Locate" quote in plans/issue24_edits.md is found exactly once in its notebook.

A quote is a ```text block whose preceding non-empty line mentions "locate"; its notebook is
the one named in the nearest "## Chapter N (`notebooks/...`)" heading above it. Quotes are
matched against each cell's source (markdown and code), after removing the block's common
indentation. Run from the repository root: .venv/bin/python plans/check_plan_quotes.py
"""
import json
import re
import sys
import textwrap
from pathlib import Path

plan = Path("plans/issue24_edits.md").read_text(encoding="utf-8").splitlines()
notebook, failures, checked = None, [], 0
i = 0
while i < len(plan):
    line = plan[i]
    heading = re.match(r"## Chapter \d+ \(`(notebooks/[^`]+)`\)", line)
    if heading:
        notebook = heading.group(1)
    elif line.strip() == "```text":
        previous = next(p for p in reversed(plan[:i]) if p.strip())
        end = next(j for j in range(i + 1, len(plan)) if plan[j].strip() == "```")
        block = textwrap.dedent("\n".join(plan[i + 1:end]))
        if "locate" in previous.lower():
            cells = json.loads(Path(notebook).read_text(encoding="utf-8"))["cells"]
            hits = sum("".join(c["source"]).count(block) for c in cells)
            checked += 1
            if hits != 1:
                failures.append(f"{notebook}: found {hits} times: {block!r}")
        i = end
    i += 1
print(f"{checked} quotes checked")
for failure in failures:
    print("FAIL", failure)
sys.exit(1 if failures else 0)
