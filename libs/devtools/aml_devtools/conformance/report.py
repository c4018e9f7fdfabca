"""What `aml check` reports, and how it is printed: the merged verdicts with the latency and
response-size figures of the calls behind them, as text or (`--json`) as JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from pydantic import BaseModel

from aml_devtools.conformance.rules import RuleResult


class Stats(BaseModel):
    count: int
    p50: float
    p90: float
    max: float


class Report(BaseModel):
    results: list[RuleResult]
    latency_ms: dict[str, Stats]
    response_bytes: dict[str, Stats]

    @property
    def failed(self) -> list[RuleResult]:
        return [r for r in self.results if r.status == "fail"]

    @property
    def warnings(self) -> list[RuleResult]:
        return [r for r in self.results if r.status == "warn"]


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile: always one of the observed values."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def stats(values: Sequence[float]) -> Stats | None:
    if not values:
        return None
    return Stats(
        count=len(values),
        p50=percentile(values, 0.5),
        p90=percentile(values, 0.9),
        max=max(values),
    )


def render(report: Report) -> str:
    """The text report: one line per rule (with what was received and the fix, when given),
    the figures per operation, then the overall result."""
    lines: list[str] = []
    for verdict in report.results:
        lines.append(f"{verdict.status.upper():<5} {verdict.rule:<15} {verdict.detail}")
        if verdict.received is not None:
            lines.append(f"{'':<22}received: {verdict.received}")
        if verdict.fix is not None:
            lines.append(f"{'':<22}fix: {verdict.fix}")
    for title, table, unit in (
        ("latency", report.latency_ms, "ms"),
        ("response size", report.response_bytes, "bytes"),
    ):
        for operation, s in table.items():
            lines.append(
                f"{title} {operation:<10} p50 {s.p50:.1f} {unit}  p90 {s.p90:.1f} {unit}  "
                f"max {s.max:.1f} {unit}  (n={s.count})"
            )
    failed, warned = len(report.failed), len(report.warnings)
    verdict_line = "conformant" if not failed else f"{failed} rule(s) violated"
    lines.append(f"result: {verdict_line}, {warned} warning(s)")
    return "\n".join(lines)


def render_json(report: Report) -> str:
    """The `--json` report: the Report model as JSON."""
    return json.dumps(report.model_dump(mode="json"), indent=2)
