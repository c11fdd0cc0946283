"""CSV exports are safe to open in a spreadsheet: a cell that starts with ``=``, ``+``, ``-``, ``@``, a tab
or a carriage return is prefixed with ``'`` (OWASP's rule against CSV injection), in the one helper every
export writes through: the REST API's skipped contacts and the dashboard's."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from libs.common.core.csv_export import csv_chunks, safe_cell
from libs.common.core.runtime import Runtime
from tests.bulk_helpers import BULK, drain
from tests.conftest import Project, sign_in
from tests.test_api_sequences import published

#: The issue's examples, as uploaded, and the cell a spreadsheet must show as text.
HOSTILE = [
    ('=HYPERLINK("http://evil.example/x";"click")', '\'=HYPERLINK("http://evil.example/x";"click")'),
    ("@SUM(1+1)*cmd|' /C calc'!A0", "'@SUM(1+1)*cmd|' /C calc'!A0"),
    ("+1", "'+1"),
    ("-1", "'-1"),
    ("\t=1+1", "'\t=1+1"),
    ("\r=1+1", "'\r=1+1"),
]


@pytest.mark.parametrize(("raw", "cell"), HOSTILE)
def test_a_cell_a_spreadsheet_would_run_is_prefixed_with_a_quote(raw: str, cell: str) -> None:
    assert safe_cell(raw) == cell


@pytest.mark.parametrize("value", ["", "plain", "4915112345678", "a=b", "x-1", " =1", "'=1", "1.5"])
def test_a_cell_that_starts_otherwise_is_written_as_it_is(value: str) -> None:
    assert safe_cell(value) == value


def test_none_is_an_empty_cell_and_numbers_are_their_text() -> None:
    assert (safe_cell(None), safe_cell(7), safe_cell(-3)) == ("", "7", "'-3")


def test_the_csv_quotes_what_needs_quoting_and_reads_back_cell_by_cell() -> None:
    rows = [[raw, "a,b", 'say "hi"', None] for raw, _ in HOSTILE]
    text = "".join(csv_chunks(["=header", "b", "c", "d"], rows))
    assert list(csv.reader(io.StringIO(text, newline=""))) == [
        ["'=header", "b", "c", "d"],
        *[[cell, "a,b", 'say "hi"', ""] for _, cell in HOSTILE],
    ]


def test_a_long_csv_comes_in_pieces_that_join_to_the_whole() -> None:
    rows = [[i, f"+49{i:09d}"] for i in range(2000)]
    pieces = list(csv_chunks(["n", "phone"], rows, chunk_chars=1000))
    assert len(pieces) > 10 and all(len(piece) < 1100 for piece in pieces)
    lines = "".join(pieces).splitlines()
    assert lines[0] == "n,phone" and lines[1] == "0,'+49000000000" and len(lines) == 2001


def test_the_skipped_contacts_of_the_api_and_the_dashboard_are_neutralised(
    app_client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    # Given a bulk job whose listed phones are formulas (each is skipped invalid_phone, kept as uploaded)
    # and a phone of no contact (skipped unknown_contact)
    app_client.headers.update(project.headers)
    sequence_id = published(app_client)
    listed = [(raw, cell) for raw, cell in HOSTILE if len(raw) <= 32]  # a listed phone: at most 32 characters
    phones = [raw for raw, _ in listed] + ["+4915112345678"]
    job = app_client.post(BULK, json={"sequence_id": sequence_id, "phones": phones})
    assert job.status_code == 202, job.text
    drain(runtime)
    expected = [["position", "contact_id", "phone", "reason"]] + [
        [str(n), "", cell, "invalid_phone"] for n, (_, cell) in enumerate(listed, start=1)
    ]
    expected.append([str(len(phones)), "", "'+4915112345678", "unknown_contact"])

    # When its skipped contacts are read through the REST API
    rest = app_client.get(f"{BULK}/{job.json()['id']}/skipped")
    # Then every formula is text, and the phone is prefixed too (OWASP's rule has no exception)
    assert rest.status_code == 200 and rest.headers["content-type"].startswith("text/csv")
    assert list(csv.reader(io.StringIO(rest.text, newline=""))) == expected

    # And the dashboard's download of the same job is the same CSV
    for header in project.headers:
        del app_client.headers[header]
    sign_in(app_client, project)
    page = app_client.get(f"/app/bulk/{job.json()['id']}/skipped.csv")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/csv")
    assert list(csv.reader(io.StringIO(page.text, newline=""))) == expected


def test_every_csv_the_product_writes_goes_through_the_helper() -> None:
    # the one helper is the only csv writer under libs/ and services/, and whatever serves text/csv uses it
    root = Path(__file__).resolve().parent.parent
    helper = root / "libs" / "common" / "core" / "csv_export.py"
    sources = [path for top in ("libs", "services") for path in (root / top).rglob("*.py")]
    writers = [p for p in sources if re.search(r"csv\.(writer|DictWriter)\(", p.read_text()) and p != helper]
    assert writers == []
    exports = [p for p in sources if "text/csv" in p.read_text()]
    assert exports, "no CSV export found: the check looks in the wrong place"
    assert [p for p in exports if "csv_chunks(" not in p.read_text()] == []
