"""Word counter wc-v1 pinned on examples: any change here means a new counter version."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aml_evaluation.wordcount import (
    _CJK_RANGES,
    WORD_COUNTER_VERSION,
    count_words,
    count_words_by_character,
    is_cjk,
)


def test_version_is_pinned() -> None:
    assert WORD_COUNTER_VERSION == "wc-v1"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        # empty and separators only
        ("", 0),
        ("   \t\n ", 0),
        ("... !!! -- ?", 0),
        ("🙂 🎉", 0),
        ("___", 0),
        # English
        ("Hello world", 2),
        ("Caroline: I went to the LGBTQ support group yesterday.", 9),
        ("  leading and trailing  ", 3),
        ("don't stop", 2),
        ("Caroline\u2019s well-known art-show", 3),  # typographic apostrophe
        ("rock 'n' roll", 3),
        ("'quoted' -dash- end-", 3),
        ("a--b", 2),
        ("a - b", 2),
        ("snake_case_name", 3),
        ("e-mail me at ann@example.com", 6),
        # punctuation glued to words
        ("Wait...what?!", 2),
        ("(yes)", 1),
        ("end.Next", 2),
        # numbers
        ("2023", 1),
        ("3.14 and 1,000,000", 3),
        ("1:56 pm on 8 May, 2023", 7),  # ":" is no connector: "1" and "56"
        ("-5 degrees", 2),
        ("$20", 1),
        ("v2.0-beta", 1),
        ("２０２３年", 2),  # full-width digits form one word, the Han character another
        # combining marks stay in their word
        ("cafe\u0301 au lait", 3),
        ("naïve café", 2),
        # Chinese: one word per Han character, punctuation 0
        ("我喜欢猫", 4),
        ("你好\uff0c世界\uff01", 4),  # full-width comma and exclamation mark
        # Japanese: Hiragana, Katakana and Han each count per character
        ("おはよう", 4),
        ("コーヒー", 4),
        ("日本語の勉強は楽しいですか。", 13),
        ("人々", 2),
        # Korean
        ("안녕하세요", 5),
        # mixed scripts
        ("iPhone手机", 3),
        ("I love 東京 and Kyoto", 6),
        ("Mochi は猫です", 5),
    ],
)
def test_count_words(text: str, words: int) -> None:
    assert count_words(text) == words


def test_is_cjk_fast_path_matches_the_range_table() -> None:
    ranges = sorted(_CJK_RANGES)
    assert list(_CJK_RANGES) == ranges
    assert all(high < low for (_, high), (low, _) in itertools.pairwise(ranges))
    # The whole BMP plus every range edge and its neighbours elsewhere.
    edges = {code + delta for pair in ranges for code in pair for delta in (-1, 0, 1)}
    for code in sorted(set(range(0x10000)) | edges | {0x10FFFF}):
        expected = any(low <= code <= high for low, high in _CJK_RANGES)
        assert is_cjk(chr(code)) is expected, hex(code)


# Every ASCII character class the rule tells apart: letters, digits, both kinds of connector,
# separators and symbols; connectors weighted up so that runs of them and edges are common.
_ASCII_TEXT = st.text(alphabet=st.sampled_from([*"aZ09'-.,- _!\t\n", "'", "-", ".", ","]))


@settings(max_examples=3000, derandomize=True)
@given(_ASCII_TEXT)
def test_ascii_text_counts_as_the_rule_written_character_by_character(text: str) -> None:
    assert count_words(text) == count_words_by_character(text)


# ASCII mixed with what the rule tells apart beyond it: CJK, letters and marks of other
# scripts, the Unicode connectors, non-ASCII spaces and symbols (a text with one curly quote is
# counted piece by piece, only its non-ASCII pieces character by character).
_MIXED_TEXT = st.text(
    alphabet=st.sampled_from(
        [*"aZ09'-., _!\t\n", "\u2019", "\u2010", "\u2011", "\u00a0", "\u3000", "\u2028",
         "手", "ア", "한", "é", "\u0301", "ß", "٣", "\U0001f600", "\u00b7"]
    )
)  # fmt: skip


@settings(max_examples=3000, derandomize=True)
@given(_MIXED_TEXT)
def test_any_text_counts_as_the_rule_written_character_by_character(text: str) -> None:
    assert count_words(text) == count_words_by_character(text)


@pytest.mark.parametrize(
    "text", ["x1.5", "1.a", "a.1", "1..2", "-5", "a--b", "'a'", "a-'b", "1,000.5-x", "a'b-c.d"]
)
def test_ascii_edge_cases_agree(text: str) -> None:
    assert count_words(text) == count_words_by_character(text)
