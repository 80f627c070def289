"""``python -m course_attn.sample``: text from a trained checkpoint (Chapter 11).

The command line lives with the trainer, in :mod:`course_attn.train.sample`; this module
only gives it the short name, as ``python -m course_attn.train`` has.
"""

import sys

from .train.sample import main

if __name__ == "__main__":
    sys.exit(main())
