"""Figures the prose quotes, recorded by the cell that computes them (all chapters).

A chapter never types a measured figure into a sentence. The cell that measures it calls
:func:`glue`, which formats the value once and stores the text as a hidden output of the
cell, in the format of myst-nb's ``glue(name, value, display=False)``: the site, JupyterLab
and Colab show nothing for it, nbval compares it like any other output. The markdown then
quotes the figure between two HTML comments, which every reader of the notebook ignores::

    at 64 tokens, <!--glue:decode_ms_64-->0.45<!--/glue--> ms with the cache

``python tools/prose_figures.py fill NOTEBOOK`` (run by ``make notebooks``) writes the
glued text between the comments, and ``tests/test_prose_figures.py`` fails when a quote
differs from its cell's output, names no glued figure, or when a sentence carries a
measured figure that no mechanism backs. So the number a reader sees in the sentence, in
JupyterLab, on Colab, on the site or in the PDF, is the one the cell printed.
"""

from __future__ import annotations

import re

__all__ = ["GLUE_PREFIX", "glue"]

# myst-nb's mime prefix for a glued value that is not displayed (myst_nb.glue(...,
# display=False)): the site hides such an output, and Jupyter front-ends render nothing
# for a mime type they do not know.
GLUE_PREFIX = "application/papermill.record/"
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


def glue(name: str, value: object, fmt: str = "{}") -> str:
    """Format ``value`` with ``fmt`` and store the text under ``name``; return the text.

    Used by every chapter whose prose quotes a measured figure (chapters 1-11).

    ``fmt`` is a :meth:`str.format` template with one field (``"{:.2f}"``, ``"{:,d}"``,
    ``"{:.0%}"``). Inside a running notebook the text becomes a hidden output of the cell
    (myst-nb's glue format, so ``{glue:text}`` would also find it); anywhere else nothing
    is displayed. The returned text lets the cell print exactly what the prose will quote::

        print(f"with the cache: {glue('decode_ms_64', ms, '{:.2f}')} ms")

    Names are letters, digits and ``_``, starting with a letter, and unique in a notebook.
    """
    if not isinstance(name, str):
        raise TypeError(f"glue: name must be a str, got {type(name).__name__}")
    if not _NAME.match(name):
        raise ValueError(f"glue: name must be letters, digits and _ starting with a letter "
                         f"(it is quoted as <!--glue:NAME-->), got {name!r}")
    if not isinstance(fmt, str):
        raise TypeError(f"glue: fmt must be a str.format template, got {type(fmt).__name__}")
    try:
        text = fmt.format(value)
    except (ValueError, TypeError, IndexError, KeyError) as err:
        raise ValueError(f"glue: cannot format {value!r} with fmt={fmt!r}: {err}") from None
    if "<" in text or "\n" in text:
        raise ValueError(f"glue: the text must fit on one line of a sentence, got {text!r}")
    _display_hidden(name, text)
    return text


def _display_hidden(name: str, text: str) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # no IPython: a script, nothing to record
        return
    if get_ipython() is None:
        return
    display({GLUE_PREFIX + "text/plain": text}, raw=True,
            metadata={"scrapbook": {"name": name, "mime_prefix": GLUE_PREFIX}})
