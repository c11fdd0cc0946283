"""CSV the product writes (every export: the REST API's and the dashboard's), safe to open in a spreadsheet.

A cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return would be read as a formula
by Excel, LibreOffice or Google Sheets (``=HYPERLINK(...)``, ``@SUM(1+1)*cmd|' /C calc'!A0``): OWASP's rule
against CSV injection is to prefix such a cell with a single quote, which the spreadsheet shows as text.
:func:`safe_cell` does that to every cell, whatever its column: a phone number ``+4915...`` is written
``'+4915...`` too (strip a leading ``'`` when a program, not a person, reads the file). Quoting of commas,
quotes and line breaks is the :mod:`csv` module's.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

#: What a cell may not start with unquoted (OWASP, CSV Injection).
FORMULA_STARTS: Final = ("=", "+", "-", "@", "\t", "\r")
#: How much text :func:`csv_chunks` gathers before it hands a piece on.
CHUNK_CHARS: Final = 64_000


def safe_cell(value: Any) -> str:
    """``value`` as the text of a CSV cell: None is empty, a cell a spreadsheet would take for a formula is
    prefixed with ``'``."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def csv_chunks(
    header: Sequence[str], rows: Iterable[Sequence[Any]], *, chunk_chars: int = CHUNK_CHARS
) -> Iterator[str]:
    """The CSV of ``header`` then ``rows``, every cell through :func:`safe_cell`, in pieces of about
    ``chunk_chars`` characters (a long export streams; ``"".join`` makes it one text)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([safe_cell(name) for name in header])
    for row in rows:
        writer.writerow([safe_cell(value) for value in row])
        if out.tell() > chunk_chars:
            yield out.getvalue()
            out.seek(0)
            out.truncate()
    yield out.getvalue()
