"""``python -m course_attn.train``: the command line of chapter 11 (see :mod:`.cli`)."""

import sys

from .cli import main

sys.exit(main())
