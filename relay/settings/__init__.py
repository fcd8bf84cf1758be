"""Settings: frozen objects, read once from ``RELAY_*`` variables, an env file and options; a
module per component (``relay``, ``inbox``, ``console``, ``tracing``) over one shared parser
(``parse``)."""

from relay.settings.console import ConsoleSettings
from relay.settings.inbox import InboxSettings
from relay.settings.parse import (
    ENV_FILE_VAR,
    ENV_PREFIX,
    SettingDoc,
    describe,
    env_name,
    known_env_names,
)
from relay.settings.relay import Settings, TlsOptions, default_name
from relay.settings.tracing import TracingSettings

__all__ = [
    "ENV_FILE_VAR",
    "ENV_PREFIX",
    "ConsoleSettings",
    "InboxSettings",
    "SettingDoc",
    "Settings",
    "TlsOptions",
    "TracingSettings",
    "default_name",
    "describe",
    "env_name",
    "known_env_names",
]
