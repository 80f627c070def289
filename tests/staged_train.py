"""``python -m course_attn.train`` with one moment of the run staged, for tests/test_train_stop.py.

Usage: ``python tests/staged_train.py STAGE [ARGS ...]`` runs the command line with ARGS,
and when the run reaches STAGE it prints ``stage: STAGE`` on the standard error, then
the work there takes longer (:data:`STAGES`): a data file on a slow disk, a model that
takes long to move to its device, a slow evaluation, a slow disk under the checkpoint or
the metrics, a long sample. ``STAGED_CALL=N`` in the environment announces the N-th time
the run reaches the stage (default: the first). The test sends its signal when it reads
the line. The moment is staged; the signal, the handlers and the process are real.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import course_attn.train.cli as cli
import course_attn.train.loop as loop
import course_attn.train.outputs as outputs
from course_attn.models.gpt import MiniGPT

#: Each stage: (module or class, the name of the function made slow there, its seconds).
#: A long stretch is work a signal should cut short (nothing to save yet, or any more);
#: a short one is work the run finishes before it stops (a step, an evaluation, a write).
STAGES: dict[str, tuple[Any, str, float]] = {
    "loading the data": (cli, "_load_data", 60.0),
    "after the model line": (cli, "train", 1.0),
    "the first evaluation": (loop, "estimate_loss", 1.0),
    "a checkpoint write": (torch, "save", 1.0),
    "the metrics write": (outputs, "write_metrics", 1.0),
    "after the last iteration": (MiniGPT, "generate", 60.0),
}


def staged(stage: str, real: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    """``real``, slower by ``seconds``, announced the ``STAGED_CALL``-th time it is called."""
    calls = []
    announce = int(os.environ.get("STAGED_CALL", "1"))

    @functools.wraps(real)
    def slow(*args: Any, **kwargs: Any) -> Any:
        calls.append(True)
        if len(calls) == announce:
            print(f"stage: {stage}", file=sys.stderr, flush=True)
        time.sleep(seconds)  # a signal that only records itself lets the sleep go on
        return real(*args, **kwargs)

    return slow


def run(stage: str, argv: list[str]) -> int:
    owner, name, seconds = STAGES[stage]
    setattr(owner, name, staged(stage, getattr(owner, name), seconds))
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1], sys.argv[2:]))
