"""Evidence recall (ATM-Bench's Recall@k and Joint@k, docs/metrics.md of JingbiaoMei/ATM-Bench):
which of a question's evidence the participant's Search returned, and where.

A participant returns *its own* memories, with its own ids, so the platform cannot ask which
source units they came from. It knows what it wrote, though, and recognises its evidence in
what comes back by one of two rules, named per dataset (:attr:`Dataset.evidence_rule`) and
recorded in the evaluation spec:

- ``unit-id-v1`` (ATM-Bench): every memory unit the platform writes starts with the line
  ``ID: <unit id>`` (aml_evaluation.atmbench: ATM-Bench's own evidence rendering, and the ids are
  the very answers of its list_recall questions, so they are in memory anyway). A candidate is
  a unit's evidence when its text names the unit's id as a whole token (not inside a longer
  run of letters, digits or underscores; case ignored). Unit ids are distinctive
  (``email202401010001``, ``20220430_132212``), so a candidate that names one was written from
  that unit, whatever the memory system did to the rest of the text.
- ``turn-text-v1`` (LoCoMo, Mem-Gallery and any dataset whose turns carry no written id): by
  content identity. A candidate is a turn's evidence when its text holds the turn's text
  (what the speaker said, as written in the Add), both compared case-folded with whitespace
  collapsed. A turn of fewer than :data:`MIN_MARKER_WORDS` words ("Yes!", "Thanks") would be
  found in unrelated memories, so it counts only as a whole line of the candidate (a leading
  ``name:`` speaker prefix ignored). The evidence id names a turn as the source does: LoCoMo's
  ``dia_id`` (``"D1:3"``) is the turn's id; Mem-Gallery's clue (``"D1:2"``) names a round, i.e.
  both turns whose id starts ``"2:"`` in session ``D1``. An evidence id naming no turn of the
  conversation (LoCoMo has a few malformed ones) cannot be recognised and is left out of the
  question's evidence; a question left with none has no evidence figures.

Both rules reward a system that returns what it was given; one that rewrites memories into new
facts (dropping the id, or the wording) is seen to retrieve less evidence than it may hold.
That is the figure's meaning, stated beside it, not a defect: Recall@k measures *retrieval of
the written evidence*, the answer quality is measured apart.

**Figures** (per question with evidence, then averaged over a cell's scored questions; ATM-Bench
`memqa/utils/evaluator/evaluate_retrieval/comprehensive_eval.py` and `joint_accuracy.py`):

- ``recall@k`` = |evidence found in the first k candidates| / |evidence| (the evidence ids as a
  set), for k in :data:`EVIDENCE_K`;
- ``joint@k`` = correct * recall@k, where correct is whether the question's headline value is
  non-zero (ATM-Bench's ``bool(accuracy)``: a list answer with any Jaccard overlap counts, as
  there), so ``joint@k`` is ATM-Bench's ``joint_partial@k``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from aml_evaluation.datasets import Conversation, Dataset, Question, Turn
from aml_evaluation.isolation import content_text

EVIDENCE_VERSION: Final = "evidence-recall-v1"
# The k of Recall@k and Joint@k (ATM-Bench's comprehensive_eval default k values).
EVIDENCE_K: Final[tuple[int, ...]] = (1, 5, 10)
# Turn texts shorter than this match only a whole line of a candidate (see the module docstring).
MIN_MARKER_WORDS: Final = 4
_SPEAKER_PREFIX: Final = re.compile(r"^[^:\n]{1,80}:\s*")


def normalize_text(text: str) -> str:
    """Case-folded, whitespace collapsed: what ``turn-text-v1`` compares."""
    return " ".join(text.casefold().split())


def candidate_text(candidate: Mapping[str, Any]) -> str:
    """A Search candidate's text: its ``content`` string, or its text parts joined by lines
    (image parts carry no text; the same reading as the isolation check's)."""
    return content_text(candidate.get("content")) or ""


def _turn_index(conversation: Conversation) -> dict[str, list[Turn]]:
    """Evidence id -> the turns it names: a turn's own id (LoCoMo's dia_id), and
    ``<session key>:<round>`` for a turn whose id is ``<round>:<role>`` (Mem-Gallery's clue
    names a round of a session: both its turns)."""
    index: dict[str, list[Turn]] = {}
    for session in conversation.sessions:
        for turn in session.turns:
            index.setdefault(turn.turn_id, []).append(turn)
            round_id, separator, _ = turn.turn_id.partition(":")
            if separator:
                index.setdefault(f"{session.session_key}:{round_id}", []).append(turn)
    return index


class EvidenceIndex:
    """A dataset's evidence markers (:meth:`markers`), its turns indexed once so that planning
    a large dataset stays linear in its size."""

    def __init__(self, dataset: Dataset) -> None:
        self._dataset = dataset
        self._turns: dict[str, dict[str, list[Turn]]] = {}

    def markers(self, question: Question) -> dict[str, list[str]]:
        """Evidence id -> the markers that identify it in a candidate's text under the
        dataset's rule: the unit id itself (``unit-id-v1``), or the normalised texts of the
        turns it names (``turn-text-v1``; ids naming no turn are left out). Empty when the
        question declares no evidence."""
        evidence = list(dict.fromkeys(question.evidence))
        if not evidence:
            return {}
        if self._dataset.evidence_rule == "unit-id-v1":
            return {evidence_id: [evidence_id] for evidence_id in evidence}
        turns = self._conversation_turns(question.conversation_id)
        markers: dict[str, list[str]] = {}
        for evidence_id in evidence:
            texts = [normalize_text(turn.text) for turn in turns.get(evidence_id, ())]
            texts = [text for text in texts if text]
            if texts:
                markers[evidence_id] = list(dict.fromkeys(texts))
        return markers

    def _conversation_turns(self, conversation_id: str) -> dict[str, list[Turn]]:
        if conversation_id not in self._turns:
            conversation = next(
                (c for c in self._dataset.conversations if c.conversation_id == conversation_id),
                None,
            )
            self._turns[conversation_id] = {} if conversation is None else _turn_index(conversation)
        return self._turns[conversation_id]


def _id_pattern(unit_id: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![0-9A-Za-z_]){re.escape(unit_id)}(?![0-9A-Za-z_])", re.IGNORECASE)


def _lines(normalized_text: str, raw_text: str) -> set[str]:
    lines = {normalize_text(line) for line in raw_text.splitlines()}
    lines |= {normalize_text(_SPEAKER_PREFIX.sub("", line)) for line in raw_text.splitlines()}
    lines.add(normalized_text)
    lines.add(normalize_text(_SPEAKER_PREFIX.sub("", raw_text)))
    return lines


def _matches(rule: str, markers: Sequence[str], raw_text: str) -> bool:
    if rule == "unit-id-v1":
        return any(_id_pattern(marker).search(raw_text) for marker in markers)
    normalized = normalize_text(raw_text)
    for marker in markers:
        if len(marker.split()) >= MIN_MARKER_WORDS:
            if marker in normalized:
                return True
        elif marker in _lines(normalized, raw_text):
            return True
    return False


def evidence_ranks(
    rule: str, markers: Mapping[str, Sequence[str]], candidates: Iterable[Mapping[str, Any]]
) -> dict[str, int | None]:
    """Evidence id -> the 1-based rank of the first candidate (in the participant's order) that
    is that evidence, or None when no candidate is."""
    ranks: dict[str, int | None] = dict.fromkeys(markers)
    for rank, candidate in enumerate(candidates, start=1):
        missing = [evidence_id for evidence_id, found in ranks.items() if found is None]
        if not missing:
            break
        text = candidate_text(candidate)
        if not text:
            continue
        for evidence_id in missing:
            if _matches(rule, markers[evidence_id], text):
                ranks[evidence_id] = rank
    return ranks


def question_evidence(
    question: Mapping[str, Any], candidates: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """A planned question's evidence figures over its Search's candidates, as a score records
    them (`evidence_ranks`, `evidence_rule`, `evidence_version`); empty for a question without
    recognisable evidence."""
    markers = question.get("evidence_markers")
    if not markers:
        return {}
    return evidence_record(question, evidence_ranks(_rule_of(question), markers, candidates))


def evidence_record(question: Mapping[str, Any], ranks: Mapping[str, int | None]) -> dict[str, Any]:
    """`question_evidence` from ranks already found (by the search, over the same candidates)."""
    return {
        "evidence_ranks": dict(ranks),
        "evidence_rule": _rule_of(question),
        "evidence_version": EVIDENCE_VERSION,
    }


def _rule_of(question: Mapping[str, Any]) -> str:
    rule = question.get("evidence_rule")
    return str(rule) if rule else "turn-text-v1"


def recall_at(ranks: Mapping[str, int | None], k: int) -> float:
    """|evidence found in the first k| / |evidence|; ranks must not be empty."""
    found = sum(1 for rank in ranks.values() if rank is not None and rank <= k)
    return found / len(ranks)
