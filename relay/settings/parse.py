"""The settings' shared parser: each component's settings (``relay``, ``inbox``, ``tracing``
in this package) declare theirs with ``setting`` and load them through ``FromEnvironment``.

Every setting is declared once, with its type, default and help text; the CLI's options and
``--help`` and the docs' table are generated from the same declarations, so the environment
variable, the option and the documentation cannot drift apart.

Precedence: command-line option > environment variable > ``--env-file`` > default. The env
file has the systemd ``EnvironmentFile`` format (``RELAY_X=value`` lines), so one file
serves systemd, Kubernetes ConfigMaps rendered as env files, and local runs.

Secrets (the two URLs) can come from files, as Docker and Kubernetes secrets and systemd
credentials provide them: ``RELAY_AMQP_URL_FILE`` holds the whole URL, and
``RELAY_AMQP_PASSWORD_FILE`` only the password, put into the URL from the other settings.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any, NamedTuple, Self
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

from relay.db.dialects import url_problem
from relay.errors import ConfigError

ENV_PREFIX = "RELAY_"


def number(convert: Callable[[str], Any], text: str, ok: Callable[[Any], bool], need: str) -> Any:
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise ValueError(f"must be {need}")
    return value


def positive_int(text: str) -> int:
    return int(number(int, text, lambda v: v > 0, "a positive whole number"))


def non_negative_int(text: str) -> int:
    return int(number(int, text, lambda v: v >= 0, "a whole number, 0 or more"))


def positive_float(text: str) -> float:
    return float(
        number(float, text, lambda v: 0 < v < float("inf"), "a positive number of seconds")
    )


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([kmg])(i?)b?|b)?\s*", re.IGNORECASE)


def _size(text: str) -> int | None:
    """A number of bytes, with an optional unit (``64MiB``, ``500kB``); None if it is not."""
    match = _SIZE.fullmatch(text)
    if match is None:
        return None
    number, prefix, binary = match.groups()
    power = "kmg".index(prefix.lower()) + 1 if prefix else 0
    return int(float(number) * (1024 if binary else 1000) ** power)


UNITS_HELP = "bytes, or a number with k, M, G, KiB, MiB or GiB"


def byte_budget(text: str) -> int:
    """A size of at least 1 MiB."""
    need = f"a size of at least 1MiB ({UNITS_HELP})"
    return int(number(_size, text, lambda v: v >= 1024**2, need))


def byte_size(text: str) -> int:
    """A size of at least one byte."""
    return int(number(_size, text, lambda v: v >= 1, f"a positive size ({UNITS_HELP})"))


def seconds_or_zero(text: str) -> float:
    return float(
        number(float, text, lambda v: 0 <= v < float("inf"), "0 or a positive number of seconds")
    )


def port(text: str) -> int:
    need = "a port number from 0 to 65535 (0 turns the server off)"
    return int(number(int, text, lambda v: 0 <= v <= 65535, need))


def choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.lower() not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return text.lower()

    return parse


def flag(text: str) -> bool:
    value = text.lower()
    if value not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        raise ValueError("must be true or false")
    return value in ("true", "1", "yes", "on")


def optional_path(text: str) -> Path | None:
    return Path(text) if text else None


def scheme_url(*schemes: str) -> Callable[[str], str]:
    """A URL with one of ``schemes``. Database URLs are checked whole here (a bad port or
    host would otherwise surface as a traceback from the driver); AMQP URLs are checked by
    pika when the relay starts (``relay.broker.connection.connection_parameters``)."""

    def parse(text: str) -> str:
        scheme = text.split(":", 1)[0].split("+", 1)[0].lower()
        if "://" not in text or scheme not in schemes:
            raise ValueError(
                f"must be a URL starting with {' or '.join(s + '://' for s in schemes)}"
            )
        if scheme.startswith("amqp"):
            return text
        try:
            parts = urlsplit(text)
            parts.port  # noqa: B018 - parsing the port is the check
        except ValueError as exc:  # "Port could not be cast...", "Invalid IPv6 URL"
            raise ValueError(f"is not a valid URL: {exc}") from None
        if (problem := url_problem(scheme, parts.path, parse_qs(parts.query))) is not None:
            raise ValueError(problem)
        return text

    return parse


def amqp_urls(text: str) -> str:
    """One AMQP URL, or several separated by commas (one per node of a cluster), all with
    the same scheme: TLS settings apply to every node alike."""
    urls = [u.strip() for u in text.split(",")]
    if not all(urls):
        raise ValueError("must be AMQP URLs separated by commas, with none empty")
    for one in urls:
        scheme_url("amqp", "amqps")(one)
    if len({u.split(":", 1)[0].lower() for u in urls}) > 1:
        raise ValueError("must use one scheme for every node: all amqp:// or all amqps://")
    return ",".join(urls)


def setting(
    default: Any,
    parse: Callable[[str], Any],
    help: str,
    secret: bool = False,
    *,
    shown: str | None = None,
    see: str = "",
) -> Any:
    """A setting: its default, its parser, and its help (``relay run --help`` and the docs).
    ``shown``: the default as written in the help, when not its ``str``; ``see``: the docs
    page (and anchor) that says more, linked from the configuration page only."""
    metadata = {"parse": parse, "help": help, "secret": secret, "shown": shown, "see": see}
    return field(default=default, metadata=metadata)


class SettingDoc(NamedTuple):
    """A setting as ``--help`` and the configuration page show it."""

    name: str
    env: str
    default: str  # as shown; empty for none
    help: str
    see: str  # a docs page, with its anchor, or empty"""


class FromEnvironment:
    """Loading from the environment, an env file and options, for a settings dataclass."""

    @classmethod
    def load(
        cls,
        environ: Mapping[str, str],
        overrides: Mapping[str, str] | None = None,
        env_file: Path | None = None,
    ) -> Self:
        """Build settings from an env file, the environment and option overrides (as text).
        Every ``RELAY_*`` variable must be a setting of the relay's or of the inbox's."""
        raw: dict[str, str] = {}
        if env_file is not None:
            raw.update(_read_env_file(env_file))
        raw.update({k: v for k, v in environ.items() if k.startswith(ENV_PREFIX)})
        _reject_unknown(raw)
        for name, text in (overrides or {}).items():
            raw[env_name(name)] = text
        _read_secret_files(raw)
        kwargs: dict[str, Any] = {}
        for f in _fields(cls):
            key = env_name(f.name)
            if key in raw:
                kwargs[f.name] = _parse(f, raw[key])
        return cls(**kwargs)


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def _fields(component: type[FromEnvironment]) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(component)  # type: ignore[arg-type]  # each one is a dataclass


def components() -> list[type[FromEnvironment]]:
    """The settings of every component that reads ``RELAY_*`` (the relay's, the inbox's):
    each a subclass of ``FromEnvironment``, defined in its own module of this package."""
    return FromEnvironment.__subclasses__()


def known_env_names() -> list[str]:
    declared = [f for component in components() for f in _fields(component)]
    names = [env_name(f.name) for f in declared] + [ENV_FILE_VAR]
    return names + [n for f in _secret_fields() for n in _secret_file_vars(f.name) if n]


def _secret_fields() -> list[dataclasses.Field[Any]]:
    fields = [f for component in components() for f in _fields(component)]
    return [f for f in fields if f.metadata["secret"]]


def _secret_file_vars(field_name: str) -> tuple[str, str]:
    """(the file of the whole value, the file of only the URL's password; empty for a secret
    that is not a URL)"""
    whole = env_name(field_name) + "_FILE"
    if not field_name.endswith("_url"):
        return whole, ""
    return whole, env_name(field_name.removesuffix("_url")) + "_PASSWORD_FILE"


def _read_secret_files(raw: dict[str, str]) -> None:
    for f in _secret_fields():
        key = env_name(f.name)
        value_file, password_file = _secret_file_vars(f.name)
        if value_file in raw:
            if key in raw:
                raise ConfigError(f"set {key} or {value_file}, not both")
            raw[key] = _read_secret(value_file, raw.pop(value_file))
        if password_file and password_file in raw:
            password = _read_secret(password_file, raw.pop(password_file))
            raw[key] = _with_password(key, raw.get(key, str(f.default)), password)


def _read_secret(var: str, path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not UTF-8 text"
        raise ConfigError(f"{var}={path}: cannot read: {reason}") from None


def _with_password(key: str, url: str, password: str) -> str:
    pieces = url.split(",")
    if len(pieces) > 1 and all("://" in piece for piece in pieces):  # a cluster: every node
        return ",".join(_with_password(key, piece.strip(), password) for piece in pieces)
    parts = urlsplit(url)
    if "://" not in url or not parts.username or parts.hostname is None:
        raise ConfigError(f"{key} must name a user and a host for a password file to apply")
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{quote(password, safe='')}@{host}"))


ENV_FILE_VAR = "RELAY_ENV_FILE"


def _parse(f: dataclasses.Field[Any], text: str) -> Any:
    try:
        return f.metadata["parse"](text.strip())
    except ValueError as exc:
        shown = "(hidden)" if f.metadata["secret"] else repr(text)
        raise ConfigError(f"{env_name(f.name)}={shown}: {exc}") from None


def _reject_unknown(raw: Mapping[str, str]) -> None:
    known = known_env_names()
    for name in raw:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{name}: unknown setting{hint}")


def _read_env_file(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{ENV_FILE_VAR}={path}: cannot read: {exc.strerror}") from None
    out: dict[str, str] = {}
    for number, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"{path}:{number}: expected NAME=value")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[name.strip()] = value
    return out


def describe(settings: type[FromEnvironment]) -> list[SettingDoc]:
    """Every setting of ``settings`` (a component's), for --help and the docs."""
    rows = []
    for f in _fields(settings):
        default = f.default
        shown = f.metadata["shown"] or ("" if default in (None, "") else str(default))
        text = f.metadata["help"]
        if f.metadata["secret"]:
            whole, password = _secret_file_vars(f.name)
            text += (
                f" Or from files: the URL [{whole}], or its password [{password}]."
                if password
                else f" Or from a file [{whole}]."
            )
        rows.append(SettingDoc(f.name, env_name(f.name), shown, text, f.metadata["see"]))
    return rows
