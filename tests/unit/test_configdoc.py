"""docs/configuration.md is exactly what `python -m aml_devtools.configdoc` generates from the
settings classes: a setting added, removed, re-defaulted or re-described in code without
regenerating the file fails here."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from aml_devtools.configdoc import SERVICES, render, rows, service_class

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
REGENERATE = "python -m aml_devtools.configdoc > docs/configuration.md"


def test_configuration_reference_is_up_to_date() -> None:
    assert DOC.read_text() == render(), f"docs/configuration.md is stale: run `{REGENERATE}`"


def test_every_setting_of_every_service_is_listed_with_a_meaning() -> None:
    text = DOC.read_text()
    listed = re.findall(r"^\| `(AML_[A-Z0-9_]+)` \|.*\| ([^|]*) \|$", text, flags=re.MULTILINE)
    names = {name for name, _ in listed}
    for service in SERVICES:
        for field in service_class(service).model_fields:
            assert f"AML_{field.upper()}" in names, f"{service}: AML_{field.upper()} not listed"
    undocumented = [name for name, meaning in listed if not meaning.strip()]
    assert not undocumented, f"settings without a comment above their field: {undocumented}"


def test_a_name_declared_twice_is_two_rows_with_their_own_defaults() -> None:
    # The scheduler's and the publisher's reconcile intervals are different settings.
    owners = [owner.__name__ for owner, fields in rows().items()
              if any(field == "reconcile_interval_seconds" for field, _ in fields)]  # fmt: skip
    assert sorted(owners) == ["PublisherSettings", "SchedulerSettings"]


def test_secrets_have_no_default_shown() -> None:
    for line in DOC.read_text().splitlines():
        if line.startswith("| `AML_") and "SecretStr" in line:
            assert "(secret, no default)" in line, line


def test_compose_sets_only_documented_names() -> None:
    documented = set(re.findall(r"`(AML_[A-Z0-9_]+)`", DOC.read_text()))
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    used = {
        key
        for service in compose["services"].values()
        for key in (service.get("environment") or {})
        if key.startswith("AML_")
    }
    assert used, "compose.yaml sets no AML_* variable: the check would prove nothing"
    assert used <= documented, f"compose.yaml sets undocumented {sorted(used - documented)}"
