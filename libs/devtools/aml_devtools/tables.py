"""The tables the `aml` commands print. `render_results` is the results table of `aml demo`,
`aml rescore` and `aml team results`/`watch`, so every command shows a job's numbers alike (a
coding job's in a layout of its own: attempts and resolved shares, `render_coding_results`);
`render_efficiency` is what a job's results cost, after them (`aml team results`/`watch`);
`render_table` lays out the plain column listings (`aml team versions|datasets|audit`,
`aml dataset list`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

from aml_evaluation.aggregate import JUDGE_FAILURE
from aml_evaluation.coding.dataset import CODING_CATEGORIES
from aml_evaluation.registry import registered


def category_numbers(
    dataset_ids: Iterable[str], datasets_root: Path | None = None
) -> dict[str, dict[str, int]]:
    """dataset id -> {category name: number} from the registered manifests (shipped, and the
    operator's under `datasets_root` when given; unknown ids left out), for render_results."""
    numbers: dict[str, dict[str, int]] = {}
    for dataset_id in dataset_ids:
        try:
            manifest = registered(dataset_id, datasets_root).manifest
        except (KeyError, OSError, ValueError):
            continue
        numbers[dataset_id] = {name: number for number, name in manifest.categories.items()}
    return numbers


def _ordered_categories(
    categories: dict[str, Any], numbers: dict[str, int]
) -> list[tuple[str, str, Any]]:
    """(name, label, metrics) in category-number order, labelled "<number> <name>"; names
    without a number follow, as given."""
    numbered = sorted((numbers[name], name) for name in categories if name in numbers)
    ordered = [(name, f"{number} {name}", categories[name]) for number, name in numbered]
    ordered += [(name, name, m) for name, m in categories.items() if name not in numbers]
    return ordered


# The evidence columns (Recall@k, Joint@k) of the results table.
_EVIDENCE_KEYS: Final = (("R", "1"), ("R", "5"), ("R", "10"), ("J", "5"), ("J", "10"))
_EVIDENCE_COLUMNS: Final = tuple(f"{kind}@{k}" for kind, k in _EVIDENCE_KEYS)


def is_coding(results: dict[str, Any]) -> bool:
    """Whether these are a coding job's results (R-2.5): of the coding track, or, where the
    results name no track (`aml rescore`), with coding attempts in them."""
    if results.get("track") is not None:
        return bool(results["track"] == "coding")
    return any(
        cell.get("attempts") is not None or cell.get("headline") == "resolved_rate"
        for data in results["datasets"].values()
        for cell in [data["overall"], *data["categories"].values()]
    )


def render_results(
    results: dict[str, Any], numbers: dict[str, dict[str, int]] | None = None
) -> str:
    """The per-category / per-dataset / Overall table, with question counts. With `numbers`
    (category_numbers), a dataset's categories are listed in their numeric order as
    "<number> <name>". A column MC (option accuracy) is added when a dataset has multiple-choice
    questions; the results' track, when named, heads the table (R-2.1). A streaming dataset's
    overall is also split by the point where its questions were asked ("(point 1)", ...). A
    coding job's results are laid out by `render_coding_results`."""
    if is_coding(results):
        return render_coding_results(results, numbers)
    cells = [
        cell
        for data in results["datasets"].values()
        for cell in [data["overall"], *data["categories"].values()]
    ]
    choices = any(cell.get("option_questions", 0) for cell in cells)
    # ATM-Bench's QS, and the evidence figures of datasets that declare evidence.
    qs = any(cell.get("qs_mean") is not None for cell in cells)
    evidence = any(cell.get("evidence") for cell in cells)
    ordered = {
        dataset_id: _ordered_categories(data["categories"], (numbers or {}).get(dataset_id, {}))
        for dataset_id, data in results["datasets"].items()
    }
    # 16 characters, or wider when a name needs it (a column never runs into the next).
    wide = max((len(d) + 1 for d in results["datasets"]), default=0)
    dw = max(16, wide)
    cw = max([16, *(len(label) + 3 for cells in ordered.values() for _, label, _ in cells)])
    header = (
        f"{'dataset':<{dw}}{'category':<{cw}}{'questions':>10}{'scored':>8}{'failed':>8}"
        f"{'J':>8}{'F1':>8}{'BLEU-1':>8}"
        + (f"{'MC':>8}" if choices else "")
        + (f"{'QS':>8}" if qs else "")
        + ("".join(f"{name:>7}" for name in _EVIDENCE_COLUMNS) if evidence else "")
    )
    rows = [header, "-" * len(header)]
    if results.get("track"):
        rows.insert(0, f"track {results['track']}: compare only with results of the same track")

    def percent(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}"

    def row(dataset: str, category: str, m: dict[str, Any]) -> str:
        figures = [m["judge_accuracy"], m["f1_mean"], m.get("bleu1_mean")]
        if choices:
            figures.append(m.get("option_accuracy"))
        if qs:
            figures.append(m.get("qs_mean"))
        found = m.get("evidence") or {}
        recall, joint = found.get("recall") or {}, found.get("joint") or {}
        shown = [recall.get(k) if kind == "R" else joint.get(k) for kind, k in _EVIDENCE_KEYS]
        return (
            f"{dataset:<{dw}}{category:<{cw}}{m['questions']:>10}{m['scored']:>8}"
            f"{m['failed']:>8}"
            + "".join(f"{percent(value):>8}" for value in figures)
            + ("".join(f"{percent(value):>7}" for value in shown) if evidence else "")
        )

    unjudged = 0
    for dataset_id, data in results["datasets"].items():
        for name, label, metrics in ordered[dataset_id]:
            note = " *" if name in data["excluded_from_overall"] else ""
            rows.append(row(dataset_id, label + note, metrics))
            unjudged += metrics.get("unjudged", 0)
        rows.append(row(dataset_id, "(dataset)", data["overall"]))
        points = (data.get("points") or {}).items()
        for ordinal, metrics in sorted(points, key=lambda cell: int(cell[0])):
            rows.append(row(dataset_id, f"(point {ordinal})", metrics))
    rows.append("-" * len(header))
    rows.append(row("Overall", "", results["overall"]))
    if unjudged:
        rows.append(
            f"J is over judged questions only: not computed for {unjudged} scored "
            "question(s) without a judge verdict (not failures)"
        )
    if choices:
        rows.append(
            "MC is option accuracy, over the multiple-choice questions alone (J over the judged "
            "open ones)"
        )
    f1_datasets = [
        dataset_id
        for dataset_id, data in results["datasets"].items()
        # Scored by token F1 alone (the `token_f1` scorer, Mem-Gallery).
        if data["overall"].get("headline") == "f1_mean"
    ]
    if f1_datasets:
        rows.append(f"scored by token F1 alone (F1 is the headline): {', '.join(f1_datasets)}")
    if qs:
        rows.append(
            "QS: ATM-Bench's question-type score (number: exact match, list_recall: Jaccard, "
            "open_end: its judge)"
        )
    if evidence:
        rows.append(
            "R@k: share of a question's evidence in its first k candidates; J@k: that share "
            "when the answer scored (Joint@k)"
        )
    if any(d["excluded_from_overall"] for d in results["datasets"].values()):
        rows.append("* reported apart, not counted in the dataset or Overall figures")
    rows.extend(_failure_lines(results))
    return "\n".join(rows)


def render_coding_results(
    results: dict[str, Any], numbers: dict[str, dict[str, int]] | None = None
) -> str:
    """A coding job's table (R-2.5): per dataset its memory conditions (the categories, as
    "<number> <name>" with `numbers`), its overall and its task types ("(type debug)", ...),
    then Overall; each with its attempts, how many were resolved, how many the platform failed
    and the resolved share over the verified ones. No judge, F1 or BLEU-1: a coding attempt has
    none."""
    # Without the manifest's numbers (an unregistered id), the conditions' own: every coding
    # dataset numbers them alike.
    conditions = {name: number for number, name in CODING_CATEGORIES.items()}
    ordered = {
        dataset_id: _ordered_categories(
            data["categories"], (numbers or {}).get(dataset_id) or conditions
        )
        for dataset_id, data in results["datasets"].items()
    }
    labels = [
        label
        for dataset_id, data in results["datasets"].items()
        for label in [
            *(label for _, label, _ in ordered[dataset_id]),
            *(f"(type {name})" for name in data.get("task_types") or {}),
        ]
    ]
    dw = max([16, *(len(d) + 1 for d in results["datasets"])])
    cw = max([16, *(len(label) + 3 for label in labels)])
    header = (
        f"{'dataset':<{dw}}{'condition':<{cw}}{'attempts':>10}{'resolved':>10}{'failed':>8}"
        f"{'resolved %':>12}"
    )

    def row(dataset: str, label: str, m: dict[str, Any]) -> str:
        resolved = "-" if m.get("resolved") is None else str(m["resolved"])
        rate = m.get("resolved_rate")
        share = "-" if rate is None else f"{100 * rate:.1f}"
        return (
            f"{dataset:<{dw}}{label:<{cw}}{m['questions']:>10}{resolved:>10}{m['failed']:>8}"
            f"{share:>12}"
        )

    rows = [
        f"track {results.get('track') or 'coding'}: compare only with results of the same track",
        header,
        "-" * len(header),
    ]
    for dataset_id, data in results["datasets"].items():
        for name, label, metrics in ordered[dataset_id]:
            note = " *" if name in data["excluded_from_overall"] else ""
            rows.append(row(dataset_id, label + note, metrics))
        rows.append(row(dataset_id, "(dataset)", data["overall"]))
        for task_type, metrics in sorted((data.get("task_types") or {}).items()):
            rows.append(row(dataset_id, f"(type {task_type})", metrics))
    rows.append("-" * len(header))
    rows.append(row("Overall", "", results["overall"]))
    rows += [
        "resolved % = resolved / verified attempts (attempts - failed); resolved: the patch made",
        "  every FAIL_TO_PASS test pass and kept every PASS_TO_PASS test passing",
        "conditions: relevant = memory holds past work that bears on the task; noisy = that work",
        "  mixed with distracting trajectories",
    ]
    if any(d["excluded_from_overall"] for d in results["datasets"].values()):
        rows.append("* reported apart, not counted in the dataset or Overall figures")
    rows.extend(_failure_lines(results))
    if any(line.startswith("failed, by kind") for line in rows):
        rows.append("failed: attempts the platform failed, counted in no share (never unresolved)")
    return "\n".join(rows)


def _failure_lines(results: dict[str, Any]) -> list[str]:
    """The failed questions by kind, over every category (those reported apart included)."""
    failures: Counter[str] = Counter()
    for data in results["datasets"].values():
        for cell in data["categories"].values():
            failures.update(cell.get("failures") or {})
    if not failures:
        return []
    lines = ["failed, by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(failures.items()))]
    if JUDGE_FAILURE in failures:
        lines.append(
            f"{JUDGE_FAILURE}: the judge model's reply held no readable verdict (CORRECT/WRONG, "
            "or ATM-Bench's accuracy true/false; counted apart, never as WRONG)"
        )
    return lines


def render_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], empty: str | None = None
) -> str:
    """Left-aligned columns two spaces apart under a dashed ruler; `empty`, when given, stands
    for a table without rows."""
    if not rows and empty is not None:
        return empty
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(f"{cell!s:<{w}}" for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_efficiency(efficiency: dict[str, Any] | None) -> str:
    """What a job's results cost (`JobResults.efficiency`, aml_evaluation.efficiency), job and
    datasets: the participant's Search and Add latency (first attempts that succeeded; the
    retried ones, timeouts, 429s and errors counted apart), the retrieved context per question
    against what the answer model used, and the platform's own model use per question."""
    if not efficiency:
        return "efficiency: not available (results computed before it was reported)"
    under = efficiency["measured_under"]
    top_k = ", ".join(f"{name} {k}" for name, k in under["search_top_k"].items()) or "-"
    rate = "-" if under["max_rps"] is None else f"{under['max_rps']:g}/s"
    concurrency = "-" if under["max_concurrency"] is None else str(under["max_concurrency"])
    lines = [
        f"efficiency ({efficiency['method']}): latency as seen from deployment "
        f"{under['deployment']!r}, network included",
        f"measured under: top_k {top_k}; declared concurrency {concurrency}, rate {rate}",
    ]
    cells = [("Overall", efficiency["overall"])] + [
        (name, data["overall"]) for name, data in efficiency["datasets"].items()
    ]

    def figure(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    calls = [
        [
            name,
            label,
            str(stats["items"]),
            str(stats["attempts"]),
            *(figure(stats["first_attempts"][p]) for p in ("p50_ms", "p95_ms", "p99_ms", "max_ms")),
            str(stats["retried"]["count"]),
            str(stats["timeouts"]),
            str(stats["rate_limited"]),
            str(stats["errors"]),
        ]
        for name, cell in cells
        for label, stats in (("Search", cell.get("search")), ("Add", cell.get("add")))
        if stats
    ]
    header = ["", "calls", "items", "attempts", "p50 ms", "p95 ms", "p99 ms", "max ms",
              "retried", "timeouts", "429s", "errors"]  # fmt: skip
    lines.append(render_table(header, calls, empty="no participant calls recorded"))
    per_question = []
    for name, cell in cells:
        context, llm = cell.get("context") or {}, cell.get("llm") or {}
        if not context and not llm:
            continue
        truncated = f"{context['truncated_questions']}/{context['questions']}" if context else "-"
        per_question.append(
            [
                name,
                figure(context.get("retrieved_tokens_mean")),
                figure(context.get("used_tokens_mean")),
                truncated,
                f"{figure(llm.get('answer_tokens_in_mean'))} / "
                f"{figure(llm.get('answer_tokens_out_mean'))}",
                f"{figure(llm.get('judge_tokens_in_mean'))} / "
                f"{figure(llm.get('judge_tokens_out_mean'))}",
            ]
        )
    header = ["per question", "retrieved tokens", "used tokens", "truncated",
              "answer in / out", "judge in / out"]  # fmt: skip
    if per_question:
        lines += ["", render_table(header, per_question)]
    lines += [
        "latency: first attempts that succeeded, request sent to response received; retried:",
        "  the attempts of calls that needed more than one (counted, not in the percentiles)",
        "tokens: words (wc-v1) of the candidates returned / of those within the answer model's",
        "  context budget; answer model tokens per question, the judge's per judged question",
    ]
    return "\n".join(lines)
