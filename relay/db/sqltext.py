"""Pure: the statements an SQL text holds, each by its first words, read past comments,
quoted strings and identifiers, the way the servers read them. For the inbox's guard
(``relay.db.inbox.guarded``): a handler's statement that would end or split the inbox's
transaction is refused however it is dressed (a comment before the keyword, a second
statement after a semicolon, MySQL's executable comments).

A first line of defence only, and a clear error: what slips past (a procedure that commits,
the driver's own connection) is found at the end of the run (``relay.inbox.flow``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# A word that may begin a statement: letters, digits, underscores (``SET @@autocommit`` keeps
# its ``@@``, so that the variable's spellings are one word each).
_WORD = re.compile(r"@{0,2}[A-Za-z_][A-Za-z_0-9.$@]*")
# PostgreSQL's dollar quote: $$ ... $$ or $tag$ ... $tag$.
_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z_0-9]*)?\$")
# The longest statement opening a guard names (``SET SESSION CHARACTERISTICS``).
_OPENING_WORDS = 3


@dataclass(frozen=True)
class Lexicon:
    """How one database reads SQL text: MySQL takes ``#`` to the end of a line as a comment and
    runs what is inside ``/*! ... */``; PostgreSQL nests block comments and has dollar
    quotes."""

    hash_comments: bool = False
    executable_comments: bool = False
    nested_comments: bool = False
    dollar_quotes: bool = False
    # ``--`` begins a comment only before a space or a control character (MySQL: ``1--1`` is
    # arithmetic).
    dash_comment_needs_space: bool = False
    # A backslash escapes the next character in every quoted string (MySQL's default), or only
    # in PostgreSQL's ``E'...'`` strings.
    backslash_escapes: bool = False


def statements(text: str, lexicon: Lexicon) -> list[tuple[str, ...]]:
    """The words of each statement in ``text``, upper-cased; comments are skipped, a quoted
    string, identifier or dollar-quoted body is one word of its quote character (never a
    keyword), ``;`` ends a statement, and a statement without words is none."""
    found: list[tuple[str, ...]] = []
    words: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == ";":
            if words:
                found.append(tuple(words))
            words = []
            i += 1
        elif _dash_comment(text, i, lexicon) or (c == "#" and lexicon.hash_comments):
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
        elif text.startswith("/*", i):
            if lexicon.executable_comments and text.startswith("/*!", i):
                # MySQL runs what is inside, after an optional version number: as code, its
                # closing ``*/`` dropped where it is met.
                i += 3
                while i < n and text[i].isdigit():
                    i += 1
                text = text[:i] + text[i:].replace("*/", " ", 1)
                n = len(text)
            else:
                i = _block_comment_end(text, i, lexicon.nested_comments)
        elif c in "'\"`":
            escaped = lexicon.backslash_escapes or (c == "'" and _escape_prefix(text, i))
            i = _quote_end(text, i, c, escaped)
            words.append(c)  # a quoted word counts as a word, never a keyword
        elif c == "$" and lexicon.dollar_quotes and (tag := _DOLLAR.match(text, i)):
            end = text.find(tag.group(0), tag.end())
            i = n if end < 0 else end + len(tag.group(0))
            words.append("$")
        elif (word := _WORD.match(text, i)) is not None:
            words.append(word.group(0).upper())
            i = word.end()
        else:
            if not c.isspace():
                words.append(c)
            i += 1
    if words:
        found.append(tuple(words))
    return found


def _dash_comment(text: str, i: int, lexicon: Lexicon) -> bool:
    if not text.startswith("--", i):
        return False
    return not lexicon.dash_comment_needs_space or i + 2 == len(text) or text[i + 2] <= " "


def _block_comment_end(text: str, start: int, nested: bool) -> int:
    depth, i = 0, start
    while i < len(text):
        if text.startswith("/*", i):
            depth = depth + 1 if nested or depth == 0 else depth
            i += 2
        elif text.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    return len(text)


def _escape_prefix(text: str, quote: int) -> bool:
    """Whether the quote at ``quote`` opens PostgreSQL's escape string (``E'...'``)."""
    return (
        quote > 0
        and text[quote - 1] in "eE"
        and (quote == 1 or not (text[quote - 2].isalnum() or text[quote - 2] == "_"))
    )


def _quote_end(text: str, start: int, quote: str, escaped: bool) -> int:
    """The index after the quoted text that starts at ``start`` (a doubled quote stays
    inside, and with ``escaped`` a backslashed one)."""
    i = start + 1
    while i < len(text):
        if escaped and text[i] == "\\":
            i += 2
        elif text[i] == quote:
            if text.startswith(quote * 2, i):
                i += 2
            else:
                return i + 1
        else:
            i += 1
    return len(text)


def ends_transaction(text: str, lexicon: Lexicon, enders: frozenset[tuple[str, ...]]) -> str | None:
    """The first statement of ``text`` that ``enders`` names (each a statement's first words,
    one to three), or that sets autocommit (``SET x = 1, autocommit = 1`` too), as the words
    that name it; None when none does."""
    for words in statements(text, lexicon):
        for size in range(min(len(words), _OPENING_WORDS), 0, -1):  # the longest name first
            if words[:size] in enders:
                return " ".join(words[:size])
        if words[0] == "SET" and any(word.endswith("AUTOCOMMIT") for word in words):
            return "SET AUTOCOMMIT"
    return None
