"""A payload as the row's page shows it (JSON pretty-printed) and as it is downloaded (the
row's type, but markup as bytes; a header value nothing can break)."""

from __future__ import annotations

import pytest

from relay.console.payloads import BYTES, download_type, file_name, pretty_json


def test_a_whole_json_payload_is_indented_in_its_own_key_order() -> None:
    payload = '{"z": 1, "a": [true, "é"]}'.encode()
    assert pretty_json(payload, True, "application/json; charset=utf-8") == (
        '{\n  "z": 1,\n  "a": [\n    true,\n    "é"\n  ]\n}'
    )
    assert pretty_json(payload, True, "application/cloudevents+json") is not None
    assert pretty_json(payload, False, "application/json") is None  # a preview cut short
    assert pretty_json(payload, True, "text/plain") is None
    assert pretty_json(b"{not json", True, "application/json") is None
    assert pretty_json(b"\xff", True, "application/json") is None
    # JSON nested past the parser's recursion, or the indenting writer's (999 deep: the row's
    # page was a 500, an outside review): shown as it is.
    for depth in (999, 100_000):
        assert pretty_json(b"[" * depth + b"]" * depth, True, "application/json") is None


@pytest.mark.parametrize(
    "stored, served, name",
    [
        ("application/json", "application/json", "row-7.json"),
        ("application/json; charset=utf-8", "application/json; charset=utf-8", "row-7.json"),
        ("text/plain", "text/plain", "row-7.txt"),
        ("application/x-protobuf", "application/x-protobuf", "row-7.bin"),
        ("text/html", BYTES, "row-7.bin"),
        ("application/xhtml+xml", BYTES, "row-7.bin"),
        ("image/svg+xml", BYTES, "row-7.bin"),
        ("text/javascript", BYTES, "row-7.bin"),
        ("", BYTES, "row-7.bin"),
        ("text/plain\r\nSet-Cookie: x=1", BYTES, "row-7.bin"),
        ("<b>", BYTES, "row-7.bin"),
    ],
)
def test_a_download_keeps_the_rows_type_but_never_one_a_browser_runs(
    stored: str, served: str, name: str
) -> None:
    assert download_type(stored) == served
    assert file_name(7, served) == name
