"""Settings: parsing from the environment, an env file and options; every error names the
setting; secrets never appear in errors or in the redacted view."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from relay.errors import ConfigError
from relay.redact import redact_url
from relay.settings import InboxSettings, Settings


def test_defaults_need_no_environment() -> None:
    s = Settings.load({})
    assert s.database_url.startswith("sqlite:///")
    assert s.window == 1000 and s.name


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("33554432", 32 * 2**20),
        ("32MiB", 32 * 2**20),
        ("32 mib", 32 * 2**20),
        ("64M", 64_000_000),
        ("5MB", 5_000_000),
        ("1.5GiB", 3 * 2**29),
        ("2048KiB", 2**21),
    ],
)
def test_the_byte_budget_takes_units(text: str, size: int) -> None:
    assert Settings.load({"RELAY_MAX_INFLIGHT_BYTES": text}).max_inflight_bytes == size


def test_environment_env_file_and_options_in_order_of_precedence(tmp_path: Path) -> None:
    env_file = tmp_path / "relay.env"
    env_file.write_text("# comment\nRELAY_BATCH_SIZE=7\nRELAY_WINDOW='11'\nRELAY_MAX_ATTEMPTS=3\n")
    s = Settings.load(
        {"RELAY_WINDOW": "12", "RELAY_MAX_ATTEMPTS": "4", "HOME": "/x"},
        {"max_attempts": "5"},
        env_file,
    )
    assert (s.batch_size, s.window, s.max_attempts) == (7, 12, 5)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"RELAY_BATCH_SIZE": "0"}, "RELAY_BATCH_SIZE='0': must be a positive whole number"),
        ({"RELAY_BATCH_SIZE": "lots"}, "RELAY_BATCH_SIZE='lots': must be a positive whole"),
        ({"RELAY_CONFIRM_TIMEOUT": "-1"}, "RELAY_CONFIRM_TIMEOUT='-1': must be a positive"),
        ({"RELAY_CONFIRM_TIMEOUT": "nan"}, "RELAY_CONFIRM_TIMEOUT='nan': must be a positive"),
        ({"RELAY_METRICS_PORT": "70000"}, "RELAY_METRICS_PORT='70000': must be a port"),
        ({"RELAY_MAX_INFLIGHT_BYTES": "500k"}, "RELAY_MAX_INFLIGHT_BYTES='500k': must be a size"),
        ({"RELAY_MAX_INFLIGHT_BYTES": "1TiB!"}, "RELAY_MAX_INFLIGHT_BYTES='1TiB!': must be a"),
        ({"RELAY_LOG_FORMAT": "xml"}, "RELAY_LOG_FORMAT='xml': must be one of text, json"),
        (
            {"RELAY_BACH_SIZE": "5"},
            "RELAY_BACH_SIZE: unknown setting (did you mean RELAY_BATCH_SIZE?)",
        ),
        ({"RELAY_AMQP_URL": "http://u:secret@h"}, "RELAY_AMQP_URL=(hidden): must be a URL"),
        ({"RELAY_DATABASE_URL": "oracle://u:secret@h/db"}, "RELAY_DATABASE_URL=(hidden)"),
        (
            {"RELAY_DATABASE_URL": "postgresql://app:pw@127.0.0.1:notaport/outbox"},
            "RELAY_DATABASE_URL=(hidden): is not a valid URL: Port could not be cast",
        ),
        (
            {"RELAY_DATABASE_URL": "postgresql://app:pw@[::1/outbox"},
            "RELAY_DATABASE_URL=(hidden): is not a valid URL: Invalid IPv6 URL",
        ),
        (
            {"RELAY_DATABASE_URL": "sqlite://"},
            "RELAY_DATABASE_URL=(hidden): must name a database file",
        ),
        ({"RELAY_DATABASE_URL": "sqlite:///:memory:"}, "RELAY_DATABASE_URL=(hidden): must name a"),
        (
            {"RELAY_DATABASE_URL": "sqlite:///file:o?mode=memory&uri=true"},
            "RELAY_DATABASE_URL=(hidden): must name a database file",
        ),
        (
            {"RELAY_LEASE": "50", "RELAY_CONFIRM_TIMEOUT": "30"},
            "RELAY_LEASE=50 must be more than 72: twice what a publish may take",
        ),
        ({"RELAY_BACKOFF_MAX": "0.5"}, "RELAY_BACKOFF_MAX must not be less than"),
        (
            {"RELAY_AMQP_URL": "amqp://u:secret@a,,amqp://u:secret@b"},
            "RELAY_AMQP_URL=(hidden): must be AMQP URLs separated by commas, with none empty",
        ),
        (
            {"RELAY_AMQP_URL": "amqp://u:secret@a,u:secret@b"},
            "RELAY_AMQP_URL=(hidden): must be a URL starting with amqp:// or amqps://",
        ),
        (
            {"RELAY_AMQP_URL": "amqps://u:secret@a,amqp://u:secret@b"},
            "RELAY_AMQP_URL=(hidden): must use one scheme for every node",
        ),
    ],
)
def test_bad_values_name_the_setting(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        Settings.load(environ)
    assert str(err.value).startswith(message)
    assert "secret" not in str(err.value)


# (RELAY_LEASE, RELAY_CONFIRM_TIMEOUT), refused: the release before took them (it asked for a
# lease over twice the timeout), so the error says what to set instead.
TOO_SHORT_LEASES = [(30, 10), (50, 30), (20, 9), (16, 7), (10, 4.5), (8, 3), (3, 1)]


@pytest.mark.parametrize(("lease", "confirm_timeout"), TOO_SHORT_LEASES)
def test_a_lease_too_short_for_the_confirm_timeout_says_what_to_set_instead(
    lease: float, confirm_timeout: float
) -> None:
    given = {"RELAY_LEASE": str(lease), "RELAY_CONFIRM_TIMEOUT": str(confirm_timeout)}
    with pytest.raises(ConfigError) as err:
        Settings.load(given)
    said = re.search(
        r"set RELAY_LEASE to (\d+) or more, or RELAY_CONFIRM_TIMEOUT below ([\d.]+)$",
        str(err.value),
    )
    assert said is not None, str(err.value)
    enough, shorter = int(said[1]), float(said[2])
    Settings.load(given | {"RELAY_LEASE": str(enough)})
    with pytest.raises(ConfigError):
        Settings.load(given | {"RELAY_LEASE": str(enough - 1)})
    Settings.load(given | {"RELAY_CONFIRM_TIMEOUT": str(shorter - 0.01)})
    with pytest.raises(ConfigError):
        Settings.load(given | {"RELAY_CONFIRM_TIMEOUT": str(shorter + 0.01)})


def test_a_lease_of_30_with_a_confirm_timeout_of_10_is_refused_saying_so() -> None:
    """Issue 57: the release before started with these."""
    with pytest.raises(ConfigError) as err:
        Settings.load({"RELAY_LEASE": "30", "RELAY_CONFIRM_TIMEOUT": "10"})
    assert str(err.value).startswith("RELAY_LEASE=30 must be more than 32: twice what")
    assert str(err.value).endswith(
        "set RELAY_LEASE to 33 or more, or RELAY_CONFIRM_TIMEOUT below 9"
    )


def test_malformed_env_file_names_the_line(tmp_path: Path) -> None:
    env_file = tmp_path / "relay.env"
    env_file.write_text("RELAY_WINDOW=5\nthis is not a setting\n")
    with pytest.raises(ConfigError, match=r"relay.env:2: expected NAME=value"):
        Settings.load({}, env_file=env_file)
    with pytest.raises(ConfigError, match="cannot read"):
        Settings.load({}, env_file=tmp_path / "missing.env")


def test_redacted_hides_passwords_only() -> None:
    s = Settings.load(
        {
            "RELAY_AMQP_URL": "amqp://relay:s3cret@rabbit:5672/%2F",
            "RELAY_DATABASE_URL": "postgresql://app:pw@db/outbox",
        }
    )
    shown = s.redacted()
    assert shown["amqp_url"] == "amqp://relay:***@rabbit:5672/%2F"
    assert shown["database_url"] == "postgresql://app:***@db/outbox"
    assert redact_url("sqlite:///x.db") == "sqlite:///x.db"


def test_a_cluster_is_a_list_of_urls_tried_in_order() -> None:
    s = Settings.load({"RELAY_AMQP_URL": "amqp://r:pw@n1:5672/%2F, amqp://r:pw@n2:5673/%2F"})
    assert s.amqp_urls == ("amqp://r:pw@n1:5672/%2F", "amqp://r:pw@n2:5673/%2F")
    assert s.redacted()["amqp_url"] == "amqp://r:***@n1:5672/%2F,amqp://r:***@n2:5673/%2F"
    assert Settings.load({}).amqp_urls == ("amqp://guest:guest@localhost:5672/%2F",)


def test_a_password_file_applies_to_every_node(tmp_path: Path) -> None:
    (tmp_path / "amqp_password").write_text("a,b@c\n")
    s = Settings.load(
        {
            "RELAY_AMQP_URL": "amqps://relay@n1:5671/%2F,amqps://relay@n2:5671/%2F",
            "RELAY_AMQP_PASSWORD_FILE": str(tmp_path / "amqp_password"),
        }
    )
    # Encoded, so the comma in the password does not split the list.
    assert s.amqp_urls == (
        "amqps://relay:a%2Cb%40c@n1:5671/%2F",
        "amqps://relay:a%2Cb%40c@n2:5671/%2F",
    )
    assert s.amqp_tls is not None


def test_secrets_from_files_whole_url_or_password_only(tmp_path: Path) -> None:
    (tmp_path / "amqp_url").write_text("amqp://relay:from-file@rabbit:5672/%2F\n")
    (tmp_path / "db_password").write_text("p@ss/word:1\n")
    s = Settings.load(
        {
            "RELAY_AMQP_URL_FILE": str(tmp_path / "amqp_url"),
            "RELAY_DATABASE_URL": "postgresql+psycopg://app@db:5432/outbox",
            "RELAY_DATABASE_PASSWORD_FILE": str(tmp_path / "db_password"),
        }
    )
    assert s.amqp_url == "amqp://relay:from-file@rabbit:5672/%2F"
    # The password is URL-encoded, so any character survives.
    assert s.database_url == "postgresql+psycopg://app:p%40ss%2Fword%3A1@db:5432/outbox"
    assert "p%40ss" not in str(s.redacted()) and "from-file" not in str(s.redacted())


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"RELAY_AMQP_URL_FILE": "{tmp}/missing"},
            "RELAY_AMQP_URL_FILE={tmp}/missing: cannot read: No such file",
        ),
        (
            {"RELAY_AMQP_URL_FILE": "{tmp}/secret", "RELAY_AMQP_URL": "amqp://h"},
            "set RELAY_AMQP_URL or RELAY_AMQP_URL_FILE, not both",
        ),
        (
            {"RELAY_DATABASE_PASSWORD_FILE": "{tmp}/secret"},
            "RELAY_DATABASE_URL must name a user and a host",
        ),
        ({"RELAY_AMQP_URL_FILE": "{tmp}/secret"}, "RELAY_AMQP_URL=(hidden): must be a URL"),
    ],
)
def test_bad_secret_files_are_named_and_never_shown(
    tmp_path: Path, environ: dict[str, str], message: str
) -> None:
    (tmp_path / "secret").write_text("not-a-url-but-a-secret")
    environ = {k: v.format(tmp=tmp_path) for k, v in environ.items()}
    with pytest.raises(ConfigError) as err:
        Settings.load(environ)
    assert str(err.value).startswith(message.format(tmp=tmp_path))
    assert "not-a-url-but-a-secret" not in str(err.value)


@pytest.mark.parametrize(
    ("consumer", "queue", "refused"),
    [
        ("", "q", False),
        ("c" * 255, "q", False),
        ("é" * 127, "q", False),  # 254 bytes
        ("c" * 256, "q", True),
        ("é" * 128, "q", True),  # 256 bytes
        ("", "q" * 256, True),  # the queue's name, the default
        ("a\x00b", "q", True),
    ],
)
def test_an_inbox_consumers_name_fits_its_key(consumer: str, queue: str, refused: bool) -> None:
    """MariaDB's key column cut a longer name short: two names alike in their first 255
    bytes were one consumer, each acking the other's messages as duplicates."""
    environ = {"RELAY_INBOX_QUEUE": queue, "RELAY_INBOX_CONSUMER": consumer}
    if not refused:
        assert InboxSettings.load(environ).inbox_consumer == (consumer or queue)
        return
    with pytest.raises(ConfigError, match=r"RELAY_INBOX_CONSUMER .* at most 255 bytes"):
        InboxSettings.load(environ)
