"""A small reader of the PDFs Chromium writes (``make pdf``), for ``tests/test_site.py``.

The project pins no PDF library, and this reader needs none: Chromium's writer (Skia) keeps
every object at the top level of the file (no object streams, no encryption), compresses
content streams with Flate only, and draws text with Type0 fonts whose glyph ids a
``/ToUnicode`` CMap maps back to characters. That is all this module reads: the pages, the
outline (bookmarks, from the outline tree, in reading order) and, per page, the text of each
font and the number of images and other external objects it draws. It is not a general PDF
parser.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

_REF = rb"(\d+) 0 R"


# The footer tools/print_pdf.py puts on every page: "12 / 420".
FOOTER = re.compile(r"\d+ / \d+")


@dataclass
class Page:
    number: int
    # font name (BaseFont without its subset prefix) -> the text drawn with it
    text_by_font: dict[str, str] = field(default_factory=dict)
    # external objects drawn (the Do operator): images, and forms Skia writes for some figures
    xobjects: int = 0

    @property
    def text(self) -> str:
        return " ".join(self.text_by_font.values())

    @property
    def blank(self) -> bool:
        """Nothing on the page but its footer: no other text, no image."""
        return self.xobjects == 0 and not FOOTER.sub("", self.text).strip()


@dataclass
class Pdf:
    pages: list[Page]
    outline: list[str]

    @property
    def text(self) -> str:
        return "\n".join(page.text for page in self.pages)


def _objects(data: bytes) -> dict[int, tuple[bytes, bytes | None]]:
    """Object number -> (its dictionary, its decoded stream or None), found through the
    file's cross-reference table (Chromium writes a classic one) and each stream's /Length."""
    start = int(re.findall(rb"startxref\s+(\d+)", data)[-1])
    table = re.match(rb"xref\s+(\d+)\s+(\d+)\s+", data[start:])
    if table is None:
        raise ValueError("no classic cross-reference table (not a file Chromium wrote)")
    first, count = int(table.group(1)), int(table.group(2))
    rows = data[start + table.end():start + table.end() + 20 * count]
    offsets = {}
    for index in range(count):
        row = rows[20 * index:20 * index + 20]
        if row[17:18] == b"n":
            offsets[first + index] = int(row[:10])
    found: dict[int, tuple[bytes, bytes | None]] = {}
    lengths: dict[int, int] = {}
    pending: list[tuple[int, bytes, int]] = []
    for number, offset in offsets.items():
        head = re.match(rb"\d+ 0 obj\s*", data[offset:offset + 40])
        at = offset + (head.end() if head else 0)
        end = data.find(b"endobj", at)
        stream_at = data.find(b"stream", at, end if end >= 0 else None)
        if stream_at < 0:
            found[number] = (data[at:end], None)
            direct = re.fullmatch(rb"\s*(\d+)\s*", data[at:end])
            if direct:
                lengths[number] = int(direct.group(1))
            continue
        body = data[at:stream_at]
        begin = stream_at + len(b"stream")
        begin += 2 if data[begin:begin + 2] == b"\r\n" else 1
        pending.append((number, body, begin))
    for number, body, begin in pending:
        length = re.search(rb"/Length\s+(\d+)(\s+0\s+R)?", body)
        size = (lengths[int(length.group(1))] if length.group(2) else int(length.group(1))) \
            if length else data.find(b"endstream", begin) - begin
        raw = data[begin:begin + size]
        found[number] = (body, zlib.decompress(raw) if b"/FlateDecode" in body else raw)
    return found


def _pdf_string(raw: bytes) -> str:
    """A literal ``(...)`` or hex ``<...>`` string of the outline: PDFDocEncoding or UTF-16."""
    if raw.startswith(b"<"):
        data = bytes.fromhex(raw[1:-1].decode())
    else:
        data = re.sub(rb"\\([nrtbf()\\])", lambda m: {
            b"n": b"\n", b"r": b"\r", b"t": b"\t", b"b": b"\b", b"f": b"\f"}.get(
                m.group(1), m.group(1)), raw[1:-1])
        data = re.sub(rb"\\([0-7]{1,3})", lambda m: bytes([int(m.group(1), 8)]), data)
    if data.startswith(b"\xfe\xff"):
        return data[2:].decode("utf-16-be", "replace")
    return data.decode("latin-1")


def _cmap(stream: bytes) -> dict[int, str]:
    """Glyph id -> text, from a ToUnicode CMap's bfchar and bfrange sections."""
    to_text: dict[int, str] = {}

    def text(hex_text: bytes) -> str:
        return bytes.fromhex(hex_text.decode()).decode("utf-16-be", "replace")

    for section in re.findall(rb"beginbfchar(.*?)endbfchar", stream, re.S):
        for glyph, value in re.findall(rb"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]*)>", section):
            to_text[int(glyph, 16)] = text(value)
    for section in re.findall(rb"beginbfrange(.*?)endbfrange", stream, re.S):
        for first, last, value in re.findall(
                rb"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>\s*(<[0-9A-Fa-f]*>|\[[^\]]*\])", section):
            lo, hi = int(first, 16), int(last, 16)
            if value.startswith(b"["):
                for offset, item in enumerate(re.findall(rb"<([0-9A-Fa-f]*)>", value)):
                    to_text[lo + offset] = text(item)
            else:
                start = bytes.fromhex(value[1:-1].decode())
                for offset in range(hi - lo + 1):
                    code = int.from_bytes(start, "big") + offset
                    to_text[lo + offset] = code.to_bytes(len(start), "big").decode(
                        "utf-16-be", "replace")
    return to_text


_TOKENS = re.compile(rb"<([0-9A-Fa-f]*)>|\((?:\\.|[^\\)])*\)|\[|\]|/[^\s/\[\]()<>]+|"
                     rb"-?\d*\.?\d+|[A-Za-z'\"*]+")


def _page_text(content: bytes, fonts: dict[bytes, tuple[str, dict[int, str]]]
               ) -> dict[str, str]:
    """The text a content stream draws, per font; a gap between words (a text position that
    moves, or a TJ kern wider than a third of an em) becomes a space."""
    out: dict[str, list[str]] = {}
    font: tuple[str, dict[int, str]] | None = None
    operands: list[bytes] = []
    for token in _TOKENS.finditer(content):
        word = token.group(0)
        if word[:1].isalpha() or word in (b"'", b'"'):
            if word == b"Tf" and len(operands) >= 2:
                font = fonts.get(operands[-2].lstrip(b"/"))
            elif word in (b"Tj", b"TJ", b"'", b'"') and font is not None:
                name, cmap = font
                parts = out.setdefault(name, [])
                for item in operands:
                    if item.startswith(b"<"):
                        hex_text = item[1:-1].decode()
                        parts.append("".join(cmap.get(int(hex_text[i:i + 4], 16), "")
                                             for i in range(0, len(hex_text), 4)))
                    elif re.fullmatch(rb"-?\d*\.?\d+", item) and float(item) < -333:
                        parts.append(" ")
                parts.append(" " if word != b"TJ" else "")
            elif word in (b"Td", b"TD", b"Tm", b"T*", b"ET") and font is not None:
                out.setdefault(font[0], []).append(" ")
            operands = []
        elif word not in (b"[", b"]"):
            operands.append(word)
    return {name: re.sub(r"\s+", " ", "".join(parts)).strip() for name, parts in out.items()}


def read(path: Path) -> Pdf:
    data = Path(path).read_bytes()
    if not data.startswith(b"%PDF-"):
        raise ValueError(f"{path} is not a PDF")
    objects = _objects(data)
    font_cache: dict[int, tuple[str, dict[int, str]]] = {}

    def font(number: int) -> tuple[str, dict[int, str]]:
        if number not in font_cache:
            body = objects[number][0]
            base = re.search(rb"/BaseFont\s*/([^\s/>]+)", body)
            name = base.group(1).decode().split("+")[-1] if base else "?"
            unicode = re.search(rb"/ToUnicode\s+" + _REF, body)
            stream = objects[int(unicode.group(1))][1] if unicode else None
            font_cache[number] = (name, _cmap(stream) if stream else {})
        return font_cache[number]

    def resources(body: bytes) -> bytes:
        ref = re.search(rb"/Resources\s+" + _REF, body)
        return objects[int(ref.group(1))][0] if ref else body

    def page_numbers(number: int) -> list[int]:  # the page tree, in reading order
        body = objects[number][0]
        if re.search(rb"/Type\s*/Page\b(?!s)", body):
            return [number]
        kids = re.search(rb"/Kids\s*\[([^\]]*)\]", body)
        return [n for ref in re.findall(_REF, kids.group(1)) if kids
                for n in page_numbers(int(ref))] if kids else []

    catalog = next(body for body, _ in objects.values()
                   if re.search(rb"/Type\s*/Catalog\b", body))
    root = re.search(rb"/Pages\s+" + _REF, catalog)
    pages: list[Page] = []
    for number in page_numbers(int(root.group(1))) if root else []:
        body, _ = objects[number]
        res = resources(body)
        font_dict = re.search(rb"/Font\s*(<<.*?>>|" + _REF + rb")", res, re.S)
        fonts: dict[bytes, tuple[str, dict[int, str]]] = {}
        if font_dict:
            entries = font_dict.group(1)
            if not entries.startswith(b"<<"):
                entries = objects[int(font_dict.group(2))][0]
            for key, ref in re.findall(rb"/([^\s/<>]+)\s+" + _REF, entries):
                fonts[key] = font(int(ref))
        contents = re.search(rb"/Contents\s*(\[[^\]]*\]|" + _REF + rb")", body)
        refs = re.findall(_REF, contents.group(1)) if contents else []
        stream = b"\n".join(objects[int(r)][1] or b"" for r in refs)
        drawn = len(re.findall(rb"(?<![^\s/])/[^\s/\[\]()<>]+\s+Do\b", stream))
        pages.append(Page(len(pages) + 1, _page_text(stream, fonts), drawn))
    return Pdf(pages=pages, outline=_outline(objects, catalog))


_TITLE = rb"/Title\s*(\((?:\\.|[^\\)])*\)|<[0-9A-Fa-f]*>)"


def _outline(objects: dict[int, tuple[bytes, bytes | None]], catalog: bytes) -> list[str]:
    """The bookmarks' titles, depth first (a title, then its children, then the next one),
    read from the catalog's outline tree: each item's /First child and /Next sibling."""
    root = re.search(rb"/Outlines\s+" + _REF, catalog)
    titles: list[str] = []
    seen: set[int] = set()

    def walk(number: int | None) -> None:
        while number is not None and number not in seen:  # a loop in a broken file ends
            seen.add(number)
            body = objects[number][0]
            title = re.search(_TITLE, body)
            if title:
                titles.append(_pdf_string(title.group(1)))
            first = re.search(rb"/First\s+" + _REF, body)
            walk(int(first.group(1)) if first else None)
            after = re.search(rb"/Next\s+" + _REF, body)
            number = int(after.group(1)) if after else None

    if root:
        first = re.search(rb"/First\s+" + _REF, objects[int(root.group(1))][0])
        walk(int(first.group(1)) if first else None)
    return titles
