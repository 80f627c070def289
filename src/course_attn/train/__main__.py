"""``python -m course_attn.train``: the command line of chapter 11 (see :mod:`.cli`)."""

import os
import sys

from .cli import main

code = main()
if code in (130, 143):
    # Stopped by SIGINT or SIGTERM: every file of the run is written and synced, and
    # nothing is left to do. The interpreter's teardown (torch's modules and threads)
    # takes seconds on a busy machine, which a scheduler's grace period may not give.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a full or closed output: its line is lost, not the run
            pass
    os._exit(code)
sys.exit(code)
