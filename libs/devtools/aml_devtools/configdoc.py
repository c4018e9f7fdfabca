"""The configuration reference, generated from the settings classes themselves:

    python -m aml_devtools.configdoc > docs/configuration.md

Every field of every service's settings class becomes one row (environment variable, type and
bounds, default, the services that read it, and its meaning taken from the comment written above
the field). tests/unit/test_configdoc.py regenerates the file and fails when it differs, so a
setting can be neither missing from the reference nor described there out of date.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import sys
import textwrap
from enum import Enum
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic_settings import BaseSettings

# Each service and its settings class (module, class), in the order of the pipeline.
SERVICES: dict[str, tuple[str, str]] = {
    "gateway": ("aml_gateway.settings", "GatewaySettings"),
    "scheduler": ("aml_scheduler.settings", "SchedulerSettings"),
    "adder": ("aml_adder.settings", "AdderSettings"),
    "searcher": ("aml_searcher.settings", "SearcherSettings"),
    "answerer": ("aml_answerer.settings", "AnswererSettings"),
    "scorer": ("aml_scorer.settings", "ScorerSettings"),
    "publisher": ("aml_publisher.settings", "PublisherSettings"),
}

HEADER = """\
# Configuration reference

Generated from the settings classes by `python -m aml_devtools.configdoc > docs/configuration.md`
(do not edit by hand: `tests/unit/test_configdoc.py` fails when this file and the code differ).

Every service reads `AML_*` environment variables (case-insensitive; pydantic-settings).
Structured values (lists, `AML_QUOTAS`, `AML_RELEASE_BASELINE`) are JSON. Secrets are shown
without a default: set them from a secret store (compose `${VAR:?…}`, Kubernetes `secretKeyRef`),
never in a file. The services column names who reads a setting; one deployment-wide value (the
evaluation spec, the LLM budget) must be the same for all of them.
"""


def service_class(name: str) -> type[BaseSettings]:
    module, class_name = SERVICES[name]
    found: type[BaseSettings] = getattr(importlib.import_module(module), class_name)
    return found


def _declarations(cls: type) -> dict[str, tuple[str, str]]:
    """Field name -> (annotation as written, the comment lines right above it) of one class's
    own body."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    tree = ast.parse(source)
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef)).body
    found: dict[str, tuple[str, str]] = {}
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        comment: list[str] = []
        row = node.lineno - 2  # the line above, 0-based
        while row >= 0 and lines[row].strip().startswith("#"):
            comment.insert(0, lines[row].strip().lstrip("#").strip())
            row -= 1
        annotation = ast.get_source_segment(source, node.annotation) or ""
        found[node.target.id] = (annotation, " ".join(comment))
    return found


def _owner(cls: type[BaseSettings], field: str) -> type:
    """The class whose own body declares `field` (where its comment is)."""
    return next(base for base in cls.__mro__ if field in inspect.get_annotations(base))


def _bounds(metadata: list[Any]) -> str:
    words = []
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            words.append(f"≥ {item.ge}")
        elif isinstance(item, annotated_types.Gt):
            words.append(f"> {item.gt}")
        elif isinstance(item, annotated_types.Le):
            words.append(f"≤ {item.le}")
        elif isinstance(item, annotated_types.Lt):
            words.append(f"< {item.lt}")
        elif isinstance(item, annotated_types.MinLen):
            words.append(f"at least {item.min_length} item(s)")
    return ", ".join(words)


def _default(value: Any, annotation: str) -> str:
    if "SecretStr" in annotation or isinstance(value, SecretStr):
        return "(secret, no default)"
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return f"`{type(value).__name__}()` defaults"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, Path):
        value = str(value)
    text = json.dumps(value) if isinstance(value, list | bool) else str(value)
    return f"`{text}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def rows() -> dict[type, list[tuple[str, list[str]]]]:
    """Per declaring class, in first-seen order: each field with the services that read it. A
    name declared by two classes (e.g. `reconcile_interval_seconds` of the scheduler and the
    publisher) is two settings, each with its own default and meaning."""
    found: dict[type, dict[str, list[str]]] = {}
    for service in SERVICES:
        cls = service_class(service)
        for field in cls.model_fields:
            found.setdefault(_owner(cls, field), {}).setdefault(field, []).append(service)
    return {owner: list(fields.items()) for owner, fields in found.items()}


def render() -> str:
    """The whole reference as Markdown, deterministic for a given code base."""
    out = [HEADER]
    for owner, fields in rows().items():
        declared = _declarations(owner)
        out.append(f"\n## `{owner.__name__}` ({owner.__module__})\n")
        doc = owner.__dict__.get("__doc__")
        if doc:
            out.append(" ".join(inspect.cleandoc(doc).split()) + "\n")
        out.append("| variable | type | default | read by | meaning |")
        out.append("|---|---|---|---|---|")
        for field, services in fields:
            info = service_class(services[0]).model_fields[field]
            annotation, meaning = declared[field]
            bounds = _bounds(info.metadata)
            kind = f"`{annotation}`" + (f" ({bounds})" if bounds else "")
            readers = "all" if len(services) == len(SERVICES) else ", ".join(services)
            row = [f"`AML_{field.upper()}`", kind, _default(info.default, annotation), readers,
                   meaning]  # fmt: skip
            out.append("| " + " | ".join(_cell(part) for part in row) + " |")
    return "\n".join(out) + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
