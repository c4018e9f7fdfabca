"""The scale scenarios' generated datasets: a job's size (`--sizes`: Adds/questions/users), a
deterministic LoCoMo-format dataset of that size (one Add per session, questions of categories
1-4 with evidence), and its registration the operator's way (`aml dataset add`)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from random import Random
from typing import Any

# `--sizes` by default: one job each, smallest first.
DEFAULT_SIZES = "2000/2000/20,10000/4000/40,50000/10000/100"
# Turns per generated session: LoCoMo-10's mean per Add (5,882 turns / 399 Adds is 14.7), and
# under chunk-v1's 20 messages, so that each session is exactly one Add.
TURNS_PER_SESSION = 14
# The generator's seed: a size's dataset is the same in every run.
SCALE_SEED = 30


@dataclass(frozen=True)
class Size:
    """One job of the scale scenario: about `adds` Add chunks and `questions` questions over
    `users` conversations (one memory user each)."""

    adds: int
    questions: int
    users: int

    @property
    def label(self) -> str:
        return f"{self.adds}/{self.questions}/{self.users}"

    @property
    def dataset_id(self) -> str:
        return f"scale-{self.adds}-{self.questions}-{self.users}"

    @property
    def items(self) -> int:
        return self.adds + self.questions


# The one job of `saturated`.
SATURATED_SIZE = Size(200, 200, 10)


def parse_sizes(text: str) -> list[Size]:
    """`ADDS/QUESTIONS/USERS[,...]`, smallest first (each size is one job, run in this order)."""
    sizes = []
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        try:
            adds, questions, users = (int(number) for number in part.split("/"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not ADDS/QUESTIONS/USERS") from None
        if users < 1 or adds < users or questions < users:
            raise argparse.ArgumentTypeError(
                f"{part!r}: at least one user, and one Add and one question per user"
            )
        sizes.append(Size(adds, questions, users))
    if not sizes:
        raise argparse.ArgumentTypeError("no size given")
    return sorted(set(sizes), key=lambda size: (size.items, size.users))


# -- the generator -----------------------------------------------------------------------------

_NAMES = (
    "Avery", "Bianca", "Caleb", "Dana", "Elias", "Farah", "Gideon", "Hana", "Ivan", "Jolene",
    "Kofi", "Lena", "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Soren", "Talia",
)  # fmt: skip
# (past, base) of what a speaker did: questions ask "what did X do", "when did X <base>".
_ACTIVITIES = (
    ("ran a charity race", "run a charity race"),
    ("painted a sunrise", "paint a sunrise"),
    ("adopted a kitten", "adopt a kitten"),
    ("joined a pottery class", "join a pottery class"),
    ("went camping", "go camping"),
    ("gave a talk about recycling", "give a talk about recycling"),
    ("baked sourdough bread", "bake sourdough bread"),
    ("played in a chess tournament", "play in a chess tournament"),
    ("volunteered for a beach cleanup", "volunteer for a beach cleanup"),
    ("tried rock climbing", "try rock climbing"),
    ("took a first cello lesson", "take a cello lesson"),
    ("planted tomatoes", "plant tomatoes"),
    ("visited an art museum", "visit an art museum"),
    ("went to a jazz concert", "go to a jazz concert"),
    ("built a bookshelf", "build a bookshelf"),
    ("took a photography course", "take a photography course"),
)
_PLACES = (
    "at the lake", "in Porto", "at the community center", "at the old library", "in Lisbon",
    "at the farmers market", "at the mountain cabin", "in the city park", "at the beach",
    "in Kyoto", "at the downtown studio", "on the family farm",
)  # fmt: skip
_RELATIONS = ("sister", "best friend", "coworker", "neighbor", "cousin", "dad", "mom", "roommate")
_FEELINGS = (
    "amazing", "exhausting but fun", "really relaxing", "a bit scary", "so rewarding",
    "unforgettable", "surprisingly easy", "harder than I thought",
)  # fmt: skip
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip
# Small talk around each session's event, about LoCoMo's 23 words a turn.
_CHAT = (
    "I have been {state} lately because of {topic}, but {remedy} always helps me feel like "
    "myself again.",
    "Did you ever finish {thing}? Last time we talked you said {clause}, and I kept "
    "wondering about it.",
    "Yes, I finally did! Now I am thinking about {plan} before the end of the {period}, if "
    "work allows it.",
    "That reminds me, my {relation} keeps asking about {topic}, so I told them everything "
    "over dinner yesterday.",
    "Honestly I think {opinion}, but let's see how it goes over the next few {period}s and "
    "then decide.",
    "Same here. Nothing beats {remedy} on a quiet evening, and I really want to make more "
    "time for it.",
)
_CHAT_WORDS = {
    "state": ("really busy", "a little tired", "pretty excited", "quite stressed"),
    "topic": ("work", "the new project", "the move", "the garden", "my classes", "the renovation"),
    "remedy": ("a long walk", "cooking dinner", "reading a good book", "calling an old friend"),
    "thing": ("that novel", "the quilt", "your thesis chapter", "the kitchen shelves"),
    "clause": ("it was almost done", "you were stuck on the ending", "you needed one more week"),
    "plan": ("a short trip to the coast", "a new hobby", "hosting a dinner party"),
    "period": ("month", "week", "summer", "year"),
    "relation": _RELATIONS,
    "opinion": ("it will work out fine", "we worry too much", "small steps matter most"),
}
# LoCoMo-10's share of each answerable category (282 / 321 / 96 / 841).
_CATEGORY_WEIGHTS = {1: 282, 2: 321, 3: 96, 4: 841}


@dataclass(frozen=True)
class _Event:
    """What one session is about: a speaker's activity, told in one turn (the evidence)."""

    speaker: str
    dia_id: str
    past: str
    base: str
    place: str
    feeling: str
    weekday: str
    session_date: str  # "25 May 2023"


def _locomo_date(moment: datetime) -> str:
    """LoCoMo's session stamp, e.g. "1:56 pm on 8 May, 2023" (aml_evaluation.datasets)."""
    hour = moment.hour % 12 or 12
    meridiem = "pm" if moment.hour >= 12 else "am"
    month = _MONTHS[moment.month - 1]
    return f"{hour}:{moment.minute:02d} {meridiem} on {moment.day} {month}, {moment.year}"


def _chat_turn(rng: Random) -> str:
    template = rng.choice(_CHAT)
    return template.format(**{key: rng.choice(words) for key, words in _CHAT_WORDS.items()})


def _session(
    rng: Random, number: int, speakers: tuple[str, str], moment: datetime
) -> tuple[list[dict[str, str]], _Event]:
    """A session of TURNS_PER_SESSION turns, the speakers alternating; its second turn tells
    the session's event (a fact the questions ask about), the third answers it."""
    teller = rng.choice(speakers)
    past, base = rng.choice(_ACTIVITIES)
    days_before = rng.randint(1, 6)
    event = _Event(
        speaker=teller,
        dia_id=f"D{number}:2",
        past=past,
        base=base,
        place=rng.choice(_PLACES),
        feeling=rng.choice(_FEELINGS),
        weekday=_WEEKDAYS[(moment - timedelta(days=days_before)).weekday()],
        session_date=f"{moment.day} {_MONTHS[moment.month - 1]} {moment.year}",
    )
    listener = speakers[1] if teller == speakers[0] else speakers[0]
    relation = rng.choice(_RELATIONS)
    texts = [
        f"Hey {teller}! So good to hear from you again. How was your week?",
        f"Guess what, {listener}! Last {event.weekday} I {past} {event.place} with my "
        f"{relation}, and honestly it was {event.feeling}.",
        f"Wow, that sounds {rng.choice(_FEELINGS)}! How did your {relation} like it? I always "
        f"wanted to {base} myself someday.",
    ]
    texts += [_chat_turn(rng) for _ in range(TURNS_PER_SESSION - len(texts))]
    # The first turn is the listener's greeting, so the teller speaks the second.
    order = (listener, teller)
    turns = [
        {"speaker": order[index % 2], "dia_id": f"D{number}:{index + 1}", "text": text}
        for index, text in enumerate(texts)
    ]
    return turns, event


def _question(rng: Random, event: _Event, other: _Event) -> dict[str, Any]:
    """A LoCoMo qa item about `event` (multi-hop: about `other` too), category drawn with
    LoCoMo-10's shares of categories 1-4 (no adversarial ones: every question has a gold)."""
    category = rng.choices(list(_CATEGORY_WEIGHTS), weights=list(_CATEGORY_WEIGHTS.values()))[0]
    name = event.speaker
    if category == 1:
        question = (
            f"What did {name} do {event.place}, and what did {other.speaker} do {other.place}?"
        )
        answer = f"{event.past}; {other.past}"
        evidence = [event.dia_id, other.dia_id]
    elif category == 2:
        question = f"When did {name} {event.base} {event.place}?"
        answer = f"The {event.weekday} before {event.session_date}"
        evidence = [event.dia_id]
    elif category == 3:
        question = f"Would {name} likely want to {event.base} again?"
        answer = f"Likely yes; {name} found it {event.feeling}"
        evidence = [event.dia_id]
    else:
        question = f"What did {name} do {event.place}?"
        answer = event.past
        evidence = [event.dia_id]
    return {"question": question, "answer": answer, "evidence": evidence, "category": category}


def locomo_sample(number: int, adds: int, questions: int, seed: int = SCALE_SEED) -> dict[str, Any]:
    """One LoCoMo sample ("conv-<number>") of `adds` sessions, each one Add under chunk-v1,
    and `questions` questions spread evenly over its sessions; the same for the same
    arguments (a string seed is hashed with sha512, whatever PYTHONHASHSEED says)."""
    rng = Random(f"{seed}/{number}")
    first, second = rng.sample(_NAMES, 2)
    conversation: dict[str, Any] = {"speaker_a": first, "speaker_b": second}
    moment = datetime(2023, 1, 2, 9, 0, tzinfo=UTC) + timedelta(days=rng.randint(0, 60))
    events = []
    for number_in_conversation in range(1, adds + 1):
        moment += timedelta(days=rng.randint(1, 3), minutes=rng.randint(0, 600))
        key = f"session_{number_in_conversation}"
        turns, event = _session(rng, number_in_conversation, (first, second), moment)
        conversation[f"{key}_date_time"] = _locomo_date(moment)
        conversation[key] = turns
        events.append(event)
    qa = [
        _question(
            rng,
            events[(index * adds) // questions % adds],
            events[((index * adds) // questions + adds // 2 + 1) % adds],
        )
        for index in range(questions)
    ]
    return {"sample_id": f"conv-{number}", "conversation": conversation, "qa": qa}


def _spread(total: int, parts: int) -> list[int]:
    """`total` split into `parts` whole shares, the first ones one larger."""
    return [total // parts + (1 if index < total % parts else 0) for index in range(parts)]


def write_scale_dataset(path: Path, size: Size, seed: int = SCALE_SEED) -> None:
    """A LoCoMo-format file (a JSON list of samples, as locomo10.json) of `size.users`
    conversations holding `size.adds` Adds and `size.questions` questions in all."""
    adds, questions = _spread(size.adds, size.users), _spread(size.questions, size.users)
    samples = [
        locomo_sample(number + 1, adds[number], questions[number], seed)
        for number in range(size.users)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(samples), encoding="utf-8")


def register_scale_datasets(datasets_root: Path, sizes: Iterable[Size]) -> list[str]:
    """Generate each size's dataset under the datasets root and register it the operator's way
    (`aml dataset add`, which parses it with the platform's LoCoMo parser and pins it by
    sha256); returns the dataset ids, for AML_SMOKE_DATASETS."""
    ids = []
    for size in sizes:
        started = time.monotonic()
        path = datasets_root / "scale" / f"{size.dataset_id}.json"
        write_scale_dataset(path, size)
        argv = [
            sys.executable, "-m", "aml_devtools.cli", "dataset", "add", str(path),
            "--format", "locomo", "--id", size.dataset_id, "--datasets-root", str(datasets_root),
        ]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"aml dataset add {size.dataset_id} refused: {done.stderr.strip()}")
        megabytes = path.stat().st_size / 2**20
        print(
            f"  {done.stdout.splitlines()[0]} ({megabytes:.1f} MB, "
            f"{time.monotonic() - started:.1f} s)",
            flush=True,
        )
        ids.append(size.dataset_id)
    return ids
