"""Pure: a payload as the row's page shows it and as it is downloaded. A JSON payload
(its content type says so, and the whole of it is shown) is pretty-printed; a download is
the row's bytes with the row's content type, as an attachment, but markup (HTML, XML, SVG,
script), which a browser would run if it ever showed the file inline, goes as bytes
(``application/octet-stream``)."""

from __future__ import annotations

import json
import mimetypes
import re

# A media type as RFC 9110 writes one (``type/subtype``), and parameters after ``;`` of
# printable ASCII: a header value, nothing a writer's row could smuggle a line break into.
_MEDIA_TYPE = re.compile(r"[A-Za-z0-9!#$&^_.+-]+/[A-Za-z0-9!#$&^_.+-]+(;[\x20-\x7e]*)?")
_ACTIVE = ("html", "xml", "svg", "javascript", "ecmascript", "xsl")
BYTES = "application/octet-stream"


def _media(content_type: str) -> str:
    """The type and subtype, lower case, without parameters."""
    return content_type.split(";", maxsplit=1)[0].strip().lower()


def is_json(content_type: str) -> bool:
    media = _media(content_type)
    return media == "application/json" or media.endswith("+json")


def pretty_json(payload: bytes, whole: bool, content_type: str) -> str | None:
    """The payload indented, keys in their order, when it is all here and JSON by its
    content type and its bytes; else None (shown as it is)."""
    if not whole or not is_json(content_type):
        return None
    try:
        return json.dumps(json.loads(payload.decode("utf-8")), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):  # UnicodeDecodeError among them; nested too deep
        return None


def download_type(content_type: str) -> str:
    """The type a payload is downloaded as: the row's, when it is a media type a browser
    would not run; else bytes."""
    given = content_type.strip()
    if not _MEDIA_TYPE.fullmatch(given) or any(a in _media(given) for a in _ACTIVE):
        return BYTES
    return given


def file_name(row_id: int, served_as: str) -> str:
    """``row-42.json``: the id, and the extension of the type it is served as."""
    media = _media(served_as)
    extension = ".json" if is_json(media) else mimetypes.guess_extension(media) or ".bin"
    return f"row-{row_id}{extension}"
