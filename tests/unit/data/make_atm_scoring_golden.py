"""Writes atm_scoring_golden.json: ATM-Bench's own answer scoring run on about a thousand inputs,
the reference tests/unit/test_atm_scoring.py holds aml_evaluation.atmbench to.

Usage: python tests/unit/data/make_atm_scoring_golden.py <ATM-Bench checkout> [output.json]

Needs a checkout of JingbiaoMei/ATM-Bench (MIT licence) as its first argument; the tests do not
run it. It copies the checkout's memqa/utils/evaluator/{normalizer,qtype_utils,config,
evaluate_qa}.py into a temporary directory, with a stand-in for memqa.global_config (config.py
reads paths and API settings from it that scoring never uses), imports them from there and
records, for each input, what the original returns: detect_qtype, normalize_qtype_value,
deterministic_accuracy, list_jaccard_score, parse_judge_response (with the verdict as
run_llm_judge reads it), build_judge_prompt and LLM_JUDGE_PROMPT. The fixture names the source
files by sha256.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

SOURCES = ("normalizer.py", "qtype_utils.py", "config.py", "evaluate_qa.py")
GLOBAL_CONFIG_STUB = """DEFAULT_PATHS = {"project_root": ".", "output_dir": "."}
OPENAI_CONFIG = {}
VLLM_TEXT_CONFIG = {}
"""

DATES = (
    "March 1",
    "1st March 2024",
    "2024-03-01",
    "01/03/2024",
    "March 1, 2024",
    "1 March",
    "Mar 1st",
    "20240301",
    "March 1-3, 2024",
    "Between April 20 and April 26",
    "April 20 to April 26, 2022",
    "Friday, 25th March 2022",
    "2022/3/25",
    "It happened on July 25",
    "December 31st, 2023",
    "Sept 5",
)
DATE_PREDICTIONS = (
    "It was on March 1st.",
    "On 1 March 2024 at 4pm",
    "March 2",
    "2024-03-02",
    "03/01/2024",
    "The first of March",
    "25 March",
    "Mar 25, 2022",
    "April 20-26",
    "March 1\u20133, 2024",
    "from April 20 until April 26",
    "I don't know",
    "unknown",
    "",
)
TIMES = (
    "4pm",
    "16:00",
    "4:00 PM",
    "4 p.m.",
    "2pm-4pm",
    "14:00 to 16:00",
    "10am to 12pm",
    "noon",
    "midnight",
    "7:30 pm",
    "between 9 and 11am",
    "Starting at 8:00 PM, with pre-drinks at 7pm",
)
TIME_PREDICTIONS = (
    "At 4 in the afternoon",
    "5pm",
    "16:30",
    "from 2 to 4pm",
    "around 4pm",
    "12:00",
    "00:00",
    "19:30",
    "9-11am",
    "2pm\u20134pm",
    "14:00\u201316:00",
    "8pm",
    "no information",
)
NUMBERS = (
    "3",
    "three",
    "1,000",
    "1000",
    "3 sessions",
    "12",
    "2.5 hours",
    "About 40",
    "0",
    "one hundred",
    "3 spots",
    "12 days",
    "1,234,567",
    "Twenty",
)
NUMBER_PREDICTIONS = (
    "There were 3.",
    "3 or 4",
    "I think it's three sessions",
    "10",
    "40",
    "2.50",
    "1234567",
    "twelve",
    "20",
    "no information",
)
CURRENCY = (
    "£12.85",
    "£12.85 (with 16-25 RAILCARD discount)",
    "$100 USD",
    "12.85 pounds",
    "$100",
    "100 dollars",
    "€45",
    "45 EUR",
    "£10 per 60-minute session, totaling £30 for three sessions",
    "The total cost was £190.50, comprising £110 for the room and £80.50 for food",
    "1,250 GBP",
    "35 JOD",
    "twelve pounds",
)
CURRENCY_PREDICTIONS = (
    "It cost £12.85.",
    "£12.80",
    "$12.85",
    "12.85",
    "USD 100",
    "£ 1,250",
    "£190.50",
    "£10 per session",
    "12 pounds",
    "€45.00",
    "AUD 35",
)
ABSTENTIONS = (
    "unknown",
    "No information available",
    "Not available",
    "abstention",
    "There is no evidence",
    "Insufficient information to answer",
    "I don't know",
)
ABSTENTION_PREDICTIONS = (
    "No information",
    "N/A",
    "not available in memories",
    "£5",
    "The answer is unknown",
    "no evidnece",
    "",
)
ID_LISTS = (
    "20220430_132212, 20220502_172850",
    "email202401010001; email202401020002",
    "20220430_132212",
    "20220430_132212_resized, email202201120830",
    "20220430_132212 / 20220502_172850 / 20220601_080000",
    "email202201120830\nemail202201150945",
    "EMAIL202201120830, email202201150945",
    "20220430_132212 and 20220502_172850",
)
ID_LIST_PREDICTIONS = (
    "The photos are 20220430_132212 and 20220502_172850.",
    "email202401010001, email202401020002, email202401030003",
    "none",
    "IDs: 20220502_172850; 20220430_132212",
    "email202201120830",
    "a, b, c",
    "",
)
PLAIN_LISTS = (
    "a, b, c",
    "apples; pears; plums",
    "red/green/blue",
    "Tom and Jerry",
    "x, y and z",
    "The Louvre, Musée d'Orsay (twice), Sainte-Chapelle.",
)
PLAIN_LIST_PREDICTIONS = (
    "a, b",
    "a, b, d",
    "c; b; a",
    "A, B, C.",
    "plums, apples, pears, cherries",
    "blue / red",
    "Jerry, Tom",
    "z and x",
    "the louvre, musee d'orsay",
    "20220430_132212, a, b",
)
OPEN = (
    "The event was Star Wars themed",
    "John and Sarah",
    "A Star Wars-themed event",
    "Yes",
    "No",
    "yes, he did",
    "Oxford Street, London",
    "12 High Street, Cambridge CB2 1TN",
    "Booking code ABC123",
    "Code: XK9F2",
    "Red, green and blue",
    "Café Nero",
    "Zürich",
    "北京",
    "The Eagle pub",
    "Pizza and pasta",
    "a, b, c",
    "Flight BA0283 to Los Angeles on 2023-07-14",
)
OPEN_PREDICTIONS = (
    "It was a Star Wars themed party",
    "Sarah and John",
    "Sarah",
    "yes",
    "no",
    "Cafe Nero",
    "The reference is ABC123",
    "REF: XK9F2",
    "blue, red and green",
    "I'm not sure",
    "   ",
    "zurich",
    "Beijing 北京",
    "a, b",
    "a, b, d",
    "d, e, f",
    "BA283 on July 14",
)
# (question, gold, prediction): relative dates resolve against the question's first full date.
QUESTIONED = (
    (
        "On 2022-02-28, when is the meeting tomorrow?",
        "Tomorrow at 4:00 PM (March 1, 2022)",
        "March 1 at 4pm",
    ),
    ("On 2022-02-28, when is the meeting tomorrow?", "Tomorrow at 4:00 PM", "4pm tomorrow"),
    ("On 2022-02-28, when is the meeting tomorrow?", "Tomorrow at 4:00 PM", "March 1 at 4pm"),
    ("On 2022-02-28, when is the meeting tomorrow?", "Tomorrow at 4:00 PM", "Today at 4pm"),
    ("It is 1 March 2022. What did I do yesterday?", "February 28", "Yesterday"),
    ("It is 1 March 2022. What did I do yesterday?", "February 28", "YESTERDAY (Feb 28)"),
    ("It is 1 March 2022. When is dinner?", "Tonight at 7pm", "March 01 at 19:00"),
    ("It is 1 March 2022. When is dinner?", "tonight at 7pm", "Tonight, 7 p.m."),
    ("When is the meeting tomorrow?", "Tomorrow at 4:00 PM", "March 1 at 4pm"),
    ("", "Tomorrow at 4:00 PM", "tomorrow at 16:00"),
    ("Dated 20220228: what is due today?", "Today", "February 28"),
)
EDGE = (
    ("", ""),
    ("", "anything"),
    ("anything", ""),
    ("   ", " "),
    ("…", "..."),
    ("٣", "3"),
    ("\uff13 sessions", "3"),
    ("2024-13-45", "2024-13-45"),
    ("0000-01-01", "01/01"),
    ("5 \u017fept", "5 sept"),
    ("12:00 noon", "midday"),
    ("(only a parenthetical)", "(something else)"),
)
QTYPE_RAWS = (
    None,
    "",
    "   ",
    "number",
    "NUM",
    " Numeric ",
    "numbers",
    "list_recall",
    "List-Recall",
    "list",
    "listrecall",
    "list recall",
    "open_end",
    "Open-Ended",
    "open",
    "openended",
    "open_ended",
    "open-end",
    "bogus",
)
QTYPE_ANSWERS = ("3", "20220430_132212, 20220502_172850", "Some prose", "", "unknown")
JUDGE_REPLIES = (
    '{"explanation": "Same date.", "accuracy": true}',
    '{"explanation": "Different.", "accuracy": false}',
    '{"explanation": "ok", "accuracy": "true"}',
    '{"explanation": "no", "accuracy": "false"}',
    '{"accuracy": "True"}',
    '{"accuracy": "TRUE "}',
    '{"accuracy": "yes"}',
    '{"accuracy": 1}',
    '{"accuracy": null}',
    '{"Accuracy": true}',
    '{"explanation": "missing field"}',
    '```json\n{"explanation": "Matches.", "accuracy": true}\n```',
    '```json\n{"explanation": "No match.", "accuracy": "false"}\n```',
    'Sure. Here is my judgment: {"explanation": "fine", "accuracy": true} Hope this helps!',
    '{"explanation": "He said "yes" twice", "accuracy": true}',
    '{"explanation": "He said "no" twice", "accuracy":false}',
    '{"explanation": "He said "no"", "accuracy": "false"}',
    '{"explanation": "broken", "accuracy": "true"',
    '"accuracy": true',
    '"Accuracy":False',
    "The prediction is correct.",
    "The prediction is incorrect.",
    "The answer does not match.",
    "No.",
    "I cannot decide.",
    "",
    "   ",
    "}{",
    "{not json}",
    "{}",
    '{"accuracy": true}{"accuracy": false}',
    '[{"accuracy": false}]',
    '{"accuracy": NaN}',
)
JUDGE_PROMPTS = (
    ("When was the concert?", "March 1, 2024", "1 March 2024"),
    ("What is {{answer}}?", "42", "forty-two"),
    ("", "", ""),
    ("Où est le café ?", "Café Nero", "{{prediction}}"),
)


def _load_original(checkout: Path, workdir: Path) -> dict[str, ModuleType]:
    package = workdir / "memqa"
    evaluator = package / "utils" / "evaluator"
    evaluator.mkdir(parents=True)
    for directory in (package, package / "utils", evaluator):
        (directory / "__init__.py").write_text("")
    (package / "global_config.py").write_text(GLOBAL_CONFIG_STUB)
    for name in SOURCES:
        shutil.copyfile(checkout / "memqa" / "utils" / "evaluator" / name, evaluator / name)
    sys.path.insert(0, str(workdir))
    return {
        name: importlib.import_module(f"memqa.utils.evaluator.{name}")
        for name in ("normalizer", "qtype_utils", "config", "evaluate_qa")
    }


def _pairs() -> list[tuple[str | None, str, str]]:
    pairs: list[tuple[str | None, str, str]] = []
    for golds, predictions in (
        (DATES, DATE_PREDICTIONS),
        (TIMES, TIME_PREDICTIONS),
        (NUMBERS, NUMBER_PREDICTIONS),
        (CURRENCY, CURRENCY_PREDICTIONS),
        (ABSTENTIONS, ABSTENTION_PREDICTIONS),
        (ID_LISTS, ID_LIST_PREDICTIONS),
        (PLAIN_LISTS, PLAIN_LIST_PREDICTIONS),
        (OPEN, OPEN_PREDICTIONS),
    ):
        # Each gold against itself, its neighbours in the category (other spellings of the
        # same or a near value) and every other one of the category's predictions.
        for index, gold in enumerate(golds):
            others = (golds[index - 1], golds[(index + 1) % len(golds)], golds[index // 2])
            some = predictions[index % 2 :: 2]
            for prediction in dict.fromkeys((gold, *others, *some)):
                pairs.append((None, gold, prediction))
    pairs.extend(QUESTIONED)
    pairs.extend((None, gold, prediction) for gold, prediction in EDGE)
    return pairs


def _judge_verdict(evaluate_qa: ModuleType, text: str) -> dict[str, Any]:
    parsed = evaluate_qa.parse_judge_response(text)
    accuracy = str(parsed.get("accuracy", "false")).lower() == "true"
    fallback = bool(parsed.get("parse_fallback"))
    lowered = text.lower()
    # Which of the original's fallbacks decided: the explicit `"accuracy": true/false` text is a
    # readable verdict, its keyword guess is not (AML reads that as no verdict).
    explicit = any(
        marker in lowered
        for marker in (
            '"accuracy": true',
            '"accuracy":true',
            '"accuracy": false',
            '"accuracy":false',
        )
    )
    return {
        "text": text,
        "original_accuracy": accuracy,
        "original_parse_fallback": fallback,
        "verdict": accuracy if not fallback or explicit else None,
    }


def _dump(fixture: dict[str, Any]) -> str:
    # One record a line: a reviewable diff when the original changes, without indenting every
    # field of a thousand records.
    sections = []
    for key, value in fixture.items():
        if isinstance(value, list):
            rows = ",\n".join("  " + json.dumps(row, ensure_ascii=False) for row in value)
            body = f"[\n{rows}\n ]"
        else:
            body = json.dumps(value, ensure_ascii=False)
        sections.append(f" {json.dumps(key)}: {body}")
    return "{\n" + ",\n".join(sections) + "\n}\n"


def main(argv: list[str]) -> None:
    if len(argv) not in (2, 3):
        raise SystemExit(__doc__)
    checkout = Path(argv[1])
    output = (
        Path(argv[2]) if len(argv) == 3 else Path(__file__).with_name("atm_scoring_golden.json")
    )
    with tempfile.TemporaryDirectory() as workdir:
        modules = _load_original(checkout, Path(workdir))
        qtype_utils, config, evaluate_qa = (
            modules["qtype_utils"],
            modules["config"],
            modules["evaluate_qa"],
        )
        pairs = []
        for question, gold, prediction in _pairs():
            pairs.append(
                {
                    "question": question,
                    "gold": gold,
                    "prediction": prediction,
                    "qtype": qtype_utils.detect_qtype(gold),
                    "exact_match": evaluate_qa.deterministic_accuracy(
                        gold, prediction, question=question
                    ),
                    "jaccard": evaluate_qa.list_jaccard_score(gold, prediction),
                }
            )
        answers = dict.fromkeys(
            text for pair in pairs for text in (pair["gold"], pair["prediction"])
        )
        fixture = {
            "source": {
                "repository": "JingbiaoMei/ATM-Bench",
                "sha256": {
                    name: hashlib.sha256(
                        (checkout / "memqa" / "utils" / "evaluator" / name).read_bytes()
                    ).hexdigest()
                    for name in SOURCES
                },
            },
            "judge_prompt_template": config.LLM_JUDGE_PROMPT,
            "abstention_phrases": list(config.ABSTENTION_PHRASES),
            "qtype_detection": [
                {"answer": answer, "qtype": qtype_utils.detect_qtype(answer)} for answer in answers
            ],
            "qtype_normalisation": [
                {
                    "raw": raw,
                    "answer": answer,
                    "qtype": evaluate_qa.normalize_qtype_value(raw, answer),
                }
                for raw in QTYPE_RAWS
                for answer in QTYPE_ANSWERS
            ],
            "pairs": pairs,
            "judge_replies": [_judge_verdict(evaluate_qa, text) for text in JUDGE_REPLIES],
            "judge_prompts": [
                {
                    "question": question,
                    "answer": answer,
                    "prediction": prediction,
                    "prompt": evaluate_qa.build_judge_prompt(question, answer, prediction),
                }
                for question, answer, prediction in JUDGE_PROMPTS
            ],
        }
    output.write_text(_dump(fixture), encoding="utf-8")
    print(f"{output}: {len(pairs)} pairs, {len(fixture['qtype_detection'])} answers")


if __name__ == "__main__":
    main(sys.argv)
