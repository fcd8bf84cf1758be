"""The README's reference tables cover every setting and every exported metric."""

from __future__ import annotations

from pathlib import Path

from relay.metrics import Metrics
from relay.settings import known_env_names

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_documents_every_setting() -> None:
    assert [name for name in known_env_names() if f"`{name}`" not in README] == []


def test_readme_documents_every_metric() -> None:
    families = Metrics().registry.collect()
    exported = {f.name + "_total" if f.type == "counter" else f.name for f in families}
    assert len(exported) >= 12
    assert [name for name in sorted(exported) if f"`{name}" not in README] == []
