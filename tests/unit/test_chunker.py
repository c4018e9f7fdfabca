"""Chunking rule chunk-v1 (R-4.5): edge cases, ids, canonical bytes, and golden Add counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aml_contract.participant import AddRequest, ImageUrl, ImageUrlPart, Message, TextPart, encode
from aml_evaluation.chunker import (
    CHUNKER_VERSION,
    AddChunk,
    chunk_messages,
    conversation_messages,
    message_words,
    plan_adds,
)
from aml_evaluation.datasets import (
    Conversation,
    Dataset,
    Session,
    Turn,
    parse_locomo,
)
from aml_evaluation.registry import load_dataset

# Golden Add counts under chunk-v1 + wc-v1, cross-checked by an independent count from the raw
# JSON (ceil(turns / 20) per non-empty session; no 20-turn window of LoCoMo reaches 2,000 words,
# the largest has about 800 whitespace tokens, so only the message rule ever splits).
LOCOMO_ADDS_PER_CONVERSATION = {
    "conv-26": 28,
    "conv-30": 27,
    "conv-41": 46,
    "conv-42": 44,
    "conv-43": 43,
    "conv-44": 46,
    "conv-47": 46,
    "conv-48": 46,
    "conv-49": 34,
    "conv-50": 39,
}
LOCOMO_ADDS_TOTAL = 399
# (conversation, session_key, messages in the chunk) for every Add of the synthetic dataset.
SYNTHETIC_PLAN = [
    ("syn-1", "session_1", 10),
    ("syn-1", "session_2", 20),  # 24 turns: the 20-message rule splits
    ("syn-1", "session_2", 4),
    ("syn-1", "session_3", 8),
    ("syn-1", "session_4", 7),
    ("syn-2", "session_1", 10),
    ("syn-2", "session_2", 3),  # three ~800-word turns: the 2,000-word rule splits
    ("syn-2", "session_2", 3),
    ("syn-2", "session_3", 8),
    ("syn-3", "session_1", 8),
    ("syn-3", "session_2", 7),
    ("syn-3", "session_3", 5),
]


def _message(words: int, role: str = "user") -> Message:
    # "w w w ..." has exactly `words` words under wc-v1; "..." has none but is non-empty.
    return Message(role=role, content=" ".join(["w"] * words) or "...", timestamp=1)


def _sizes(chunks: list[list[Message]]) -> list[int]:
    return [len(chunk) for chunk in chunks]


def test_version_is_pinned() -> None:
    assert CHUNKER_VERSION == "chunk-v1"


# --- the rule --------------------------------------------------------------------------------


def test_empty_input_has_no_chunks() -> None:
    assert chunk_messages([]) == []


@pytest.mark.parametrize(
    ("count", "sizes"),
    [(1, [1]), (19, [19]), (20, [20]), (21, [20, 1]), (40, [20, 20]), (41, [20, 20, 1])],
)
def test_message_limit(count: int, sizes: list[int]) -> None:
    assert _sizes(chunk_messages([_message(1) for _ in range(count)])) == sizes


def test_word_limit_exactly_2000_fits() -> None:
    messages = [_message(1000), _message(999), _message(1)]
    assert _sizes(chunk_messages(messages)) == [3]


def test_word_limit_2001_splits() -> None:
    messages = [_message(1000), _message(999), _message(2)]
    assert _sizes(chunk_messages(messages)) == [2, 1]


def test_single_message_of_exactly_2000_words_shares_nothing_after_it() -> None:
    assert _sizes(chunk_messages([_message(2000), _message(1)])) == [1, 1]
    assert _sizes(chunk_messages([_message(2000), _message(0)])) == [2]


def test_oversized_message_forms_its_own_chunk() -> None:
    messages = [_message(5), _message(2500), _message(5)]
    chunks = chunk_messages(messages)
    assert _sizes(chunks) == [1, 1, 1]
    assert chunks[1][0] is messages[1]  # never split, never copied


def test_both_limits_together() -> None:
    # 20 messages of 100 words = 2,000 words: full on both counts at once.
    assert _sizes(chunk_messages([_message(100) for _ in range(21)])) == [20, 1]
    # The word limit binds before the message limit.
    assert _sizes(chunk_messages([_message(150) for _ in range(20)])) == [13, 7]


def test_custom_limits() -> None:
    messages = [_message(3) for _ in range(5)]
    assert _sizes(chunk_messages(messages, max_messages=2)) == [2, 2, 1]
    assert _sizes(chunk_messages(messages, max_words=7)) == [2, 2, 1]


def test_words_are_counted_on_the_content_as_sent() -> None:
    # The "Speaker: " prefix and the caption count too.
    turn = Turn(turn_id="D1:1", speaker="Ann Lee", text="hi there", image_caption="a red cat")
    session = Session(session_key="session_1", index=1, date_text="x", timestamp_ms=5, turns=[turn])
    (message,) = conversation_messages(session, ("Ann Lee", "Bob"))
    assert message.content == "Ann Lee: hi there [shares an image: a red cat]"
    assert message_words(message) == 2 + 2 + 3 + 3


def test_multimodal_content_counts_text_parts_only() -> None:
    message = Message(
        role="user",
        content=[
            TextPart(type="text", text="two words"),
            ImageUrlPart(type="image_url", image_url=ImageUrl(url="https://x.invalid/a.png")),
        ],
    )
    assert message_words(message) == 2


# --- messages from turns ---------------------------------------------------------------------


def _session(key: str, index: int, turns: int, timestamp_ms: int) -> Session:
    return Session(
        session_key=key,
        index=index,
        date_text="1:00 pm on 1 May, 2023",
        timestamp_ms=timestamp_ms,
        turns=[
            Turn(turn_id=f"D{index}:{n}", speaker="Ann" if n % 2 else "Bob", text=f"line {n}")
            for n in range(1, turns + 1)
        ],
    )


def test_conversation_messages() -> None:
    session = _session("session_1", 1, 3, 1_683_554_160_000)
    messages = conversation_messages(session, ("Ann", "Bob"))
    assert [m.role for m in messages] == ["user", "assistant", "user"]
    assert [m.content for m in messages] == ["Ann: line 1", "Bob: line 2", "Ann: line 3"]
    assert {m.timestamp for m in messages} == {1_683_554_160_000}


def test_unknown_speaker_is_rejected() -> None:
    with pytest.raises(ValueError, match="'Ann' is neither"):
        conversation_messages(_session("session_1", 1, 1, 0), ("Cid", "Bob"))


# --- plans and ids ---------------------------------------------------------------------------


def _dataset() -> Dataset:
    return Dataset(
        dataset_id="ds",
        version="1",
        categories={4: "single-hop"},
        scorer="token_f1",
        conversations=[
            Conversation(
                conversation_id="c1",
                speakers=("Ann", "Bob"),
                sessions=[_session("session_1", 1, 21, 1000), _session("session_2", 2, 3, 2000)],
            ),
            Conversation(
                conversation_id="c2",
                speakers=("Ann", "Bob"),
                sessions=[_session("session_1", 1, 2, 3000)],
            ),
        ],
        questions=[],
    )


def test_plan_ids_seq_and_session_boundaries() -> None:
    adds = plan_adds(_dataset(), "run7")
    assert [(a.conversation_id, a.seq, len(a.request.messages)) for a in adds] == [
        ("c1", 1, 20),
        ("c1", 2, 1),  # the 21st turn of session 1 stays in session 1
        ("c1", 3, 3),  # a new session always starts a new chunk
        ("c2", 1, 2),  # seq restarts per conversation
    ]
    first = adds[0]
    assert first.request_id == "eval:run7:ds:c1:chunk-1"
    assert first.user_id == "eval:run7:ds:c1"
    assert first.session_id == "eval:run7:c1:session_1"
    assert adds[2].request_id == "eval:run7:ds:c1:chunk-3"
    assert adds[2].session_id == "eval:run7:c1:session_2"
    assert adds[3].user_id == "eval:run7:ds:c2"
    for add in adds:
        assert (add.request.request_id, add.request.user_id, add.request.session_id) == (
            add.request_id,
            add.user_id,
            add.session_id,
        )
    assert len({a.request_id for a in adds}) == len(adds)
    # Message order is preserved across the split.
    contents = [m.content for a in adds[:2] for m in a.request.messages]
    assert contents == [f"{'Ann' if n % 2 else 'Bob'}: line {n}" for n in range(1, 22)]


def test_plan_is_deterministic() -> None:
    first = [a.model_dump() for a in plan_adds(_dataset(), "r")]
    second = [a.model_dump() for a in plan_adds(_dataset(), "r")]
    assert first == second


# --- canonical body --------------------------------------------------------------------------


def test_canonical_body_bytes() -> None:
    request = AddRequest(
        request_id="eval:r:ds:c:chunk-1",
        messages=[
            Message(role="user", content="Wen: 日本語 ok", timestamp=7),
            Message(role="assistant", content="Kaito: “hi”"),
        ],
        user_id="eval:r:ds:c",
        session_id="eval:r:c:session_1",
    )
    body = encode(request)
    expected = (
        '{"messages":[{"content":"Wen: 日本語 ok","role":"user","timestamp":7},'
        '{"content":"Kaito: “hi”","role":"assistant"}],'
        '"request_id":"eval:r:ds:c:chunk-1","session_id":"eval:r:c:session_1",'
        '"user_id":"eval:r:ds:c"}'
    ).encode()
    assert body == expected
    assert encode(AddRequest.model_validate_json(body)) == body
    assert json.loads(body) == request.model_dump(exclude_none=True)


def test_add_chunk_is_immutable() -> None:
    add = plan_adds(_dataset(), "r")[0]
    assert isinstance(add, AddChunk)
    with pytest.raises(ValueError, match="frozen"):
        add.seq = 9


# --- golden counts ---------------------------------------------------------------------------


@pytest.mark.parametrize("relative", ["locomo/locomo10.json", "locomo-dial481-fix/locomo10.json"])
def test_golden_locomo_add_counts(datasets_root: Path, relative: str) -> None:
    samples = json.loads((datasets_root / relative).read_bytes())
    adds = plan_adds(parse_locomo(samples, "locomo", "v"), "golden")
    per_conversation: dict[str, int] = {}
    for add in adds:
        per_conversation[add.conversation_id] = per_conversation.get(add.conversation_id, 0) + 1
    assert per_conversation == LOCOMO_ADDS_PER_CONVERSATION
    assert len(adds) == LOCOMO_ADDS_TOTAL
    assert sum(len(a.request.messages) for a in adds) == 5882
    assert max(len(a.request.messages) for a in adds) == 20
    assert adds[0].request_id == "eval:golden:locomo:conv-26:chunk-1"
    assert adds[-1].request_id == "eval:golden:locomo:conv-50:chunk-39"


def test_golden_synthetic_plan(tmp_path: Path) -> None:
    adds = plan_adds(load_dataset("synthetic", tmp_path), "golden")
    plan = [
        (a.conversation_id, a.session_id.rsplit(":", 1)[1], len(a.request.messages)) for a in adds
    ]
    assert plan == SYNTHETIC_PLAN
    assert [a.seq for a in adds] == [1, 2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3]
    long_chunk_words = [sum(message_words(m) for m in a.request.messages) for a in adds[6:8]]
    assert all(words <= 2000 for words in long_chunk_words)
    assert sum(long_chunk_words) > 2000
