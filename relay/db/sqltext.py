"""Pure: the statements an SQL text holds, each by its words, read past comments, quoted
strings and identifiers, the way the servers read them. For the inbox's guard
(``relay.db.inbox_transaction.judged``, over the text the driver gets): a handler's
statement that would end or split the inbox's transaction, change its connection's session,
or touch the inbox's own tables is refused however it is dressed (a comment before the
keyword, a second statement after a semicolon, MySQL's and MariaDB's executable comments). A
session's quoting can change (PostgreSQL's ``standard_conforming_strings``, MySQL's
``NO_BACKSLASH_ESCAPES``), so the text is read both ways, and what either reading finds is
refused.

What is not SQLAlchemy's to send (a procedure that commits, the driver's own connection) is
found at the end of the run (``relay.inbox.flow``)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

# A word that may begin a statement: letters, digits, underscores (``SET @@autocommit`` keeps
# its ``@@``, so that the variable's spellings are one word each).
_WORD = re.compile(r"@{0,2}[A-Za-z_][A-Za-z_0-9.$@]*")
# PostgreSQL's dollar quote: $$ ... $$ or $tag$ ... $tag$, a tag's letters any non-ASCII
# character too (an outside review: ``$é$`` was no quote to the guard, and a COMMIT after it
# went through).
_DOLLAR = re.compile(r"\$([A-Za-z_\u0080-\U0010ffff][A-Za-z_0-9\u0080-\U0010ffff]*)?\$")
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
    # SQLite quotes a name in brackets (``[inbox_received]``), and takes a string where a name
    # goes for that name (``DELETE FROM 'inbox_received'``).
    bracket_names: bool = False
    string_names: bool = False
    # PostgreSQL spells a name's characters as escapes in ``U&"..."`` (``U&"inbox\0072..."``),
    # with another escape character after ``UESCAPE``.
    unicode_names: bool = False
    # SQLite's ``CREATE TRIGGER ... BEGIN ...; ...; END`` is one statement: its body's ``;``
    # ends none (split there, its ``END`` read as a COMMIT refused the trigger).
    trigger_bodies: bool = False


def statements(text: str, lexicon: Lexicon) -> list[tuple[str, ...]]:
    """The words of each statement in ``text``, upper-cased; comments are skipped, a quoted
    string or identifier is one word of its quote character (never a keyword), a
    dollar-quoted body a ``$`` and its own words, each after a ``$``; ``;`` ends a
    statement, and a statement without words is none."""
    found: list[tuple[str, ...]] = []
    words: list[str] = []
    body = _TriggerBody()
    executable = 0  # MySQL's executable comments open here
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if executable and text.startswith("*/", i):
            executable -= 1
            i += 2
        elif c == ";":
            if not body.open:
                if words:
                    found.append(tuple(words))
                words, body = [], _TriggerBody()
            i += 1
        elif _dash_comment(text, i, lexicon) or (c == "#" and lexicon.hash_comments):
            # To the line's end: PostgreSQL's ends at a carriage return too (an outside
            # review: ``--\rCOMMIT`` was a comment to the guard only); read so everywhere,
            # a comment the guard ends early only has more words judged.
            i = next((j + 1 for j in range(i, n) if text[j] in "\r\n"), n)
        elif text.startswith("/*", i):
            if lexicon.executable_comments and text.startswith(("/*!", "/*M!"), i):
                # MySQL (``/*!``) and MariaDB (``/*M!``) run what is inside, after an
                # optional version number: read as code, comments inside it as comments,
                # to its own ``*/`` (an outside review: the first ``*/`` was taken for its
                # end, a comment's inside it, and what followed hidden).
                i += 4 if text.startswith("/*M!", i) else 3
                while i < n and text[i].isdigit():
                    i += 1
                executable += 1
            else:
                i = _block_comment_end(text, i, lexicon.nested_comments)
        elif c == "'":
            escaped = lexicon.backslash_escapes or _escape_prefix(text, i)
            end = _quote_end(text, i, c, escaped)
            # A string counts as a word, never a keyword; where it may be a name, its text
            # follows the quote (``relay.db.inbox_transaction`` looks for the inbox's tables).
            named = text[i + 1 : end - 1].replace("''", "'").upper() if lexicon.string_names else ""
            words.append(c + named)
            i = end
        elif c == "[" and lexicon.bracket_names:
            end = text.find("]", i + 1)
            end = n if end < 0 else end + 1
            words.append(text[i + 1 : end - 1].upper())
            i = end
        elif lexicon.unicode_names and text.startswith(('U&"', 'u&"'), i):
            end = _quote_end(text, i + 2, '"', False)
            name, i = _unicode_name(text, text[i + 3 : end - 1].replace('""', '"'), end)
            words.append(name.upper())
        elif c in '"`':
            # A quoted identifier (or MySQL's double-quoted string): its name, as a word,
            # for the tables a handler may not name; a backtick escapes nothing.
            end = _quote_end(text, i, c, lexicon.backslash_escapes and c == '"')
            words.append(text[i + 1 : end - 1].replace(c * 2, c).upper())
            i = end
        elif c == "$" and lexicon.dollar_quotes and (tag := _DOLLAR.match(text, i)):
            end = text.find(tag.group(0), tag.end())
            code = text[tag.end() : n if end < 0 else end]
            i = n if end < 0 else end + len(tag.group(0))
            # A body is code (a DO block's, a function's, a trigger's): its words go with
            # the statement's, marked, never a keyword of it, so that a name of the
            # inbox's tables there is found (an outside review: a deferred trigger's body
            # deleted the message's key at its COMMIT).
            words.append("$")
            words.extend("$" + word for inner in statements(code, lexicon) for word in inner)
        elif (word := _WORD.match(text, i)) is not None:
            words.append(word.group(0).upper())
            if lexicon.trigger_bodies:
                body.read(words)
            i = word.end()
        else:
            if not c.isspace():
                words.append(c)
            i += 1
    if words:
        found.append(tuple(words))
    return found


class _TriggerBody:
    """Where a statement is in a trigger's body, told of each keyword (a bare word: a quoted
    name is never one) as it comes: the body opens at the ``BEGIN`` of a statement that
    begins ``CREATE [TEMP] TRIGGER`` and closes at the ``END`` that closes no ``CASE``."""

    def __init__(self) -> None:
        self.trigger: bool | None = None  # decided by the statement's first keywords
        self.open = False
        self.cases = 0
        self.keywords: list[str] = []

    def read(self, words: list[str]) -> None:
        word = words[-1]
        if self.trigger is None:
            self.keywords.append(word)
            opening = self.keywords if words[: len(self.keywords)] == self.keywords else []
            if opening in (["CREATE", "TRIGGER"], *_TEMP_TRIGGER):
                self.trigger = True
            elif opening not in (["CREATE"], ["CREATE", "TEMP"], ["CREATE", "TEMPORARY"]):
                self.trigger = False
            return
        if not self.trigger:
            return
        if word == "BEGIN" and not self.open:
            self.open = True
        elif self.open and word == "CASE":
            self.cases += 1
        elif self.open and word == "END":
            if self.cases:
                self.cases -= 1
            else:
                self.open = False


_TEMP_TRIGGER = (["CREATE", "TEMP", "TRIGGER"], ["CREATE", "TEMPORARY", "TRIGGER"])

# After a ``U&"..."`` name: its escape character, if not the backslash.
_UESCAPE = re.compile(r"\s*UESCAPE\s*'(.)'", re.IGNORECASE)
# An escape in a ``U&"..."`` name (with ``\`` standing for its escape character): four hex
# digits, or ``+`` and six; the escape character doubled is itself.
_UNICODE_ESCAPE = r"{0}(?:([0-9A-Fa-f]{{4}})|\+([0-9A-Fa-f]{{6}})|({0}))"


def _unicode_name(text: str, quoted: str, after: int) -> tuple[str, int]:
    """A ``U&"..."`` name's characters (``quoted``: what its quotes hold), and where the text
    goes on after it and its ``UESCAPE`` clause, if any."""
    escape, clause = "\\", _UESCAPE.match(text, after)
    if clause is not None:
        escape, after = clause.group(1), clause.end()

    def character(found: re.Match[str]) -> str:
        code = found.group(1) or found.group(2)
        return found.group(3) if code is None else chr(int(code, 16))

    return re.sub(_UNICODE_ESCAPE.format(re.escape(escape)), character, quoted), after


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


def refusal(
    text: str,
    lexicon: Lexicon,
    enders: frozenset[tuple[str, ...]],
    changes_session: Callable[[tuple[str, ...]], bool],
    tables: frozenset[str],
) -> str | None:
    """Why a handler may not run ``text``, or None: its first statement that ``enders`` names
    (each a statement's first words, one to three) or that sets autocommit (``SET x = 1,
    autocommit = 1`` too), one that ``changes_session`` says changes the connection's
    session, or one that names one of ``tables`` (upper case), as the words that name it;
    read with and without backslash escapes."""
    for escapes in (lexicon.backslash_escapes, not lexicon.backslash_escapes):
        reading = dataclasses.replace(lexicon, backslash_escapes=escapes)
        for words in statements(text, reading):
            found = _refused(words, enders, changes_session, tables)
            if found is not None:
                return found
    return None


def _refused(
    words: tuple[str, ...],
    enders: frozenset[tuple[str, ...]],
    changes_session: Callable[[tuple[str, ...]], bool],
    tables: frozenset[str],
) -> str | None:
    for size in range(min(len(words), _OPENING_WORDS), 0, -1):  # the longest name first
        if words[:size] in enders:
            return f"it ends the transaction ({' '.join(words[:size])})"
    if words[0] == "SET" and any(word.endswith("AUTOCOMMIT") for word in words):
        return "it ends the transaction (SET AUTOCOMMIT)"
    if changes_session(words):
        return f"it changes the connection's session ({' '.join(words[:2])})"
    # A string's word is its quote and, where it may be a name, its text (``string_names``).
    named = next((n for w in words if (n := w.lstrip("'$")).rpartition(".")[2] in tables), None)
    if named is not None:
        return f"it names the inbox's own table {named.lower()}"
    return None
