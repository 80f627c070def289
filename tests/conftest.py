"""Shared pytest hooks. The site test (tests/test_site.py) leaves a summary to print.

The ``"triton"`` attention path runs its kernel compiled on a CUDA GPU, and on CPU tensors
only under Triton's interpreter, which must be switched on before ``triton`` is first
imported: here, before any test module is collected. Without a GPU it is switched on
(unless the environment already says ``TRITON_INTERPRET``), so every test parametrized over
``ATTENTION_IMPLS`` runs the kernel on the CPU. With a GPU it stays off, so that
``tests/test_triton_attention.py`` runs the compiled kernel; the CPU-tensor tests of the
other paths then skip ``impl="triton"``, as they do where triton is not installed.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

TRITON_FOUND = importlib.util.find_spec("triton") is not None
if TRITON_FOUND and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"
#: The interpreter runs every program of every launch in Python (about 0.25 s for one small
#: attention call): the model-variant matrix runs impl="triton" on the two variants that use
#: every feature the kernel has (bias or rotation, grouped heads, a window mask), and greedy
#: decoding (dozens of calls per token) only where the kernel is compiled.
TRITON_VARIANTS = {"rope+gqa+window", "alibi+gqa+window"}
#: Uncompiled, FlexAttention evaluates its mods through four nested vmaps (about twice the
#: manual path's time per call): the model-variant matrix runs impl="flex" on the same two
#: variants (every feature its path converts: a bias, a rotation, grouped heads, a window
#: mask, a KV cache), greedy decoding included.
FLEX_VARIANTS = TRITON_VARIANTS


def _triton_skip_reason(item) -> str | None:
    """Why a test parametrized with ``impl="triton"`` is skipped here (None: it runs)."""
    if "test_triton_attention" in item.nodeid:
        return None  # that module decides for itself
    if not TRITON_FOUND:
        return "triton is not installed (impl='triton' needs it; Linux only)"
    if not INTERPRETING:
        return ("CPU tensors run impl='triton' only under TRITON_INTERPRET=1 (off: a GPU is "
                "here, and tests/test_triton_attention.py runs the compiled kernel)")
    params = item.callspec.params
    if "test_model_variants" in item.nodeid and "greedy" in item.name:
        return "greedy decoding through Triton's interpreter takes minutes (compiled on a GPU)"
    variant = params.get("variant", "")
    if "test_model_variants" in item.nodeid and "meta" not in item.name and variant and \
            variant not in TRITON_VARIANTS:
        return f"the interpreter runs impl='triton' on the variants {sorted(TRITON_VARIANTS)}"
    return None


@pytest.fixture(autouse=True)
def _flex_uncompiled_outside_its_own_tests(request, monkeypatch):
    """``FLEX_COMPILE = False`` except in tests/test_flex_attention.py (see the module)."""
    if "test_flex_attention" not in request.node.nodeid:
        from course_attn.core import flex_attention

        monkeypatch.setattr(flex_attention, "FLEX_COMPILE", False)


def _flex_skip_reason(item) -> str | None:
    """Why a test parametrized with ``impl="flex"`` is skipped here (None: it runs)."""
    variant = item.callspec.params.get("variant", "")
    if "test_model_variants" in item.nodeid and "meta" not in item.name and variant and \
            variant not in FLEX_VARIANTS:
        return f"the shared matrix runs impl='flex' on the variants {sorted(FLEX_VARIANTS)}"
    return None


def pytest_collection_modifyitems(config, items):
    """Skip ``impl="triton"`` in the shared tests where its kernel cannot run, or crawls, and
    ``impl="flex"`` outside its variants of the model matrix."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        why = {"triton": _triton_skip_reason, "flex": _flex_skip_reason}.get(params.get("impl"))
        reason = None if why is None else why(item)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    try:
        import site_check
    except ImportError:  # tests/ not on sys.path (another import mode): nothing to print
        return
    lines = config.stash.get(site_check.SUMMARY_KEY, None)
    if lines:
        terminalreporter.section("site test summary")
        for line in lines:
            terminalreporter.write_line(line)
