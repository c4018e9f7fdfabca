"""Word counter ``wc-v1`` (SPEC R-4.5): the frozen word count behind the 2,000-word chunk limit.

Chunk boundaries, and therefore Add request ids, depend on this count, so the rule below is
frozen. Any change, however small, must ship as a new counter with a new version string;
``wc-v1`` must keep returning the same numbers for the same text forever.

Definition of ``count_words(text)`` under ``wc-v1``:

1. **CJK characters.** Every character in one of the ranges listed in ``_CJK_RANGES`` (Han
   ideographs incl. extensions and compatibility ideographs, the ideographic iteration marks
   U+3005-U+3007, Hiragana, Katakana incl. phonetic extensions and half-width forms, Hangul
   syllables and jamo) counts as one word on its own. Such a character also ends any word run
   that is open before it, so ``"iPhone手机"`` is 1 + 2 = 3 words.
2. **Word characters.** Any other character ``c`` for which ``c.isalnum()`` is true (letters and
   digits of any script, including full-width forms), or whose Unicode general category starts
   with ``M`` (combining marks, so decomposed accents and Indic vowel signs stay in their word).
3. **Words.** A word is a maximal run of word characters. Runs are joined into one word by a
   single *connector* character that has a word character immediately on both sides:

   - the apostrophes U+0027 and U+2019 (right single quotation mark) and the hyphens U+002D,
     U+2010 and U+2011 (non-breaking hyphen), anywhere: ``don't`` = 1, ``well-known`` = 1,
     ``O'Neil`` = 1, also with U+2019 as the apostrophe;
   - ``.`` and ``,`` only between two ASCII/Unicode decimal digits (``str.isdecimal``):
     ``3.14`` = 1, ``1,000,000`` = 1, but ``end.Next`` = 2.

   Two connectors in a row do not join (``a--b`` = 2), and a connector at the edge of a run is
   not part of the word (``'quoted'`` = 1, ``-5`` = 1).
4. **Everything else** (spaces, punctuation, symbols, emoji, underscores, control characters)
   only separates words and counts 0. A token made only of such characters counts 0, and the
   empty string counts 0.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from typing import Final

WORD_COUNTER_VERSION: Final = "wc-v1"

# Inclusive code point ranges, sorted and disjoint (is_cjk bisects them); part of the frozen
# definition, never edit in place.
_CJK_RANGES: Final[tuple[tuple[int, int], ...]] = (
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x3005, 0x3007),  # ideographic iteration mark, closing mark, number zero
    (0x3040, 0x309F),  # Hiragana
    (0x30A0, 0x30FF),  # Katakana
    (0x3130, 0x318F),  # Hangul Compatibility Jamo
    (0x31F0, 0x31FF),  # Katakana Phonetic Extensions
    (0x3400, 0x4DBF),  # CJK Unified Ideographs Extension A
    (0x4E00, 0x9FFF),  # CJK Unified Ideographs
    (0xA960, 0xA97F),  # Hangul Jamo Extended-A
    (0xAC00, 0xD7AF),  # Hangul Syllables
    (0xD7B0, 0xD7FF),  # Hangul Jamo Extended-B
    (0xF900, 0xFAFF),  # CJK Compatibility Ideographs
    (0xFF66, 0xFF9F),  # Half-width Katakana
    (0xFFA0, 0xFFDC),  # Half-width Hangul
    (0x20000, 0x3FFFF),  # CJK Unified Ideographs Extensions B and later, supplementary planes
)

_CJK_STARTS: Final = tuple(low for low, _ in _CJK_RANGES)
_ANYWHERE_CONNECTORS: Final = frozenset("'\u2019-\u2010\u2011")
_DIGIT_CONNECTORS: Final = frozenset(".,")


def is_cjk(char: str) -> bool:
    code = ord(char)
    # Fast path: nothing below the first range (all of ASCII and Latin) is CJK.
    if code < _CJK_STARTS[0]:
        return False
    position = bisect.bisect_right(_CJK_STARTS, code) - 1
    return code <= _CJK_RANGES[position][1]


def _is_word_char(char: str) -> bool:
    if char.isascii():
        return char.isalnum()
    if is_cjk(char):
        return False
    return char.isalnum() or unicodedata.category(char).startswith("M")


def _joins(text: str, index: int) -> bool:
    """Whether the connector candidate at ``index`` glues the word chars on both sides."""
    if index == 0 or index + 1 >= len(text):
        return False
    before, char, after = text[index - 1], text[index], text[index + 1]
    if not (_is_word_char(before) and _is_word_char(after)):
        return False
    if char in _ANYWHERE_CONNECTORS:
        return True
    return char in _DIGIT_CONNECTORS and before.isdecimal() and after.isdecimal()


# The same rule for ASCII text, where it reduces to: runs of letters and digits, joined by one
# apostrophe or hyphen anywhere, or one "." or "," between two digits. A job's plan counts every
# message of its dataset, nearly all of them ASCII, and the character loop below was most of
# the plan's CPU; the two are checked against each other (tests/unit/test_wordcount.py).
_ASCII_WORD: Final = re.compile(r"[A-Za-z0-9]+(?:(?:['-]|(?<=[0-9])[.,](?=[0-9]))[A-Za-z0-9]+)*")


def count_words(text: str) -> int:
    """Count words in ``text`` by the frozen ``wc-v1`` rule (see the module docstring)."""
    if text.isascii():
        return len(_ASCII_WORD.findall(text))
    # Whitespace is neither a word character nor a connector, so no word spans it: the count of
    # a text is the sum over its whitespace-separated pieces, and only a piece that is not
    # ASCII needs the character loop (most non-ASCII text is ASCII with a curly quote here or
    # an emoji there).
    words = 0
    for piece in text.split():
        if piece.isascii():
            words += len(_ASCII_WORD.findall(piece))
        else:
            words += count_words_by_character(piece)
    return words


def count_words_by_character(text: str) -> int:
    """``count_words`` for any text, one character at a time: the rule as written."""
    words = 0
    in_word = False
    for index, char in enumerate(text):
        if not char.isascii() and is_cjk(char):
            words += 1
            in_word = False
        elif _is_word_char(char):
            if not in_word:
                words += 1
                in_word = True
        elif in_word and _joins(text, index):
            # The run continues through the connector; the next char is a word char.
            continue
        else:
            in_word = False
    return words
