"""Generator of the synthetic dataset ``synthetic_v1.json`` (LoCoMo format), AML's own small
public benchmark for smoke runs and tests.

Everything here is invented: the people, their facts and their dialogue. Nothing is random; the
long "chapter" turns are built by cycling fixed phrase lists, so running this script always
writes the same bytes. The output is committed next to this script and pinned by sha256 in
``../manifests/synthetic.json``; after any change, rerun it and update that hash.

What the data is built to exercise:

- ``syn-1`` session 2 has 24 turns, so it needs two Add requests under the 20-message rule;
- ``syn-2`` session 2 has three turns of about 800 words each, so it splits under the
  2,000-word rule;
- ``syn-3`` has a Japanese turn (CJK word counting), times ``12:15 pm`` and ``12:05 am``, an
  empty ``session_4`` and a date key without a session (both occur in LoCoMo);
- turns sharing an image carry ``img_url`` and ``blip_caption``;
- questions cover categories 1-4 and adversarial category 5 (``adversarial_answer`` only), one
  answer is an integer, and each answer is stated in the turns listed as evidence.

Usage: ``python generate.py`` rewrites the file; ``python generate.py --check`` exits 1 if the
committed file differs from what this script produces.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).resolve().parent / "synthetic_v1.json"
IMAGE_BASE = "https://example.invalid/aml-synthetic/"

# A turn as the conversations below write it, before it becomes a LoCoMo turn: (speaker index
# 0|1, text) or (speaker index, text, image file, caption).
ScriptedTurn = tuple[int, str] | tuple[int, str, str, str]


def _chapter(part: int, target_words: int) -> str:
    """About ``target_words`` words of invented prose, varied by cycling lists at coprime
    strides."""
    subjects = [
        "Edda",
        "the old keeper",
        "the ferryman",
        "the girl from the salt flats",
        "the harbour cat",
        "the night wind",
        "the orchard",
    ]
    verbs = [
        "watched",
        "remembered",
        "counted",
        "followed",
        "mended",
        "listened to",
        "waited for",
        "carried",
        "named",
        "forgot",
        "painted",
    ]
    objects = [
        "the lamp on the tower",
        "the grey boats in the bay",
        "a ladder of wet stones",
        "the letters from the mainland",
        "the bitter apples of the salt orchard",
        "a map drawn in chalk",
        "the tide tables",
        "the bells of the drowned chapel",
        "a coil of tarred rope",
        "the gulls above the pier",
        "the fog",
        "a jar of pickled plums",
        "the keeper's logbook",
    ]
    closings = [
        "before the sun rose",
        "while the kettle sang",
        "as the storm turned north",
        "until the lamp went out",
        "without saying a word",
    ]
    sentences: list[str] = []
    words = 0
    index = part * 17
    while words < target_words:
        sentence = (
            f"{subjects[index % len(subjects)]} {verbs[(index * 3) % len(verbs)]} "
            f"{objects[(index * 5) % len(objects)]} {closings[(index * 2) % len(closings)]}."
        )
        sentence = sentence[0].upper() + sentence[1:]
        sentences.append(sentence)
        words += len(sentence.split())
        index += 1
    return " ".join(sentences)


def _conv1() -> tuple[tuple[str, str], list[tuple[str, list[ScriptedTurn]]]]:
    speakers = ("Mira Okafor", "Tomas Reyes")
    s1: list[ScriptedTurn] = [
        (
            0,
            "Morning Tomas! Big family news: my sister Lena moved to Porto in March 2023 to "
            "start a job at a ceramics studio.",
        ),
        (1, "That's wonderful! Porto is lovely. Is she settling in?"),
        (0, "She is. She already found a flat near the river with a bright blue door."),
        (1, "Nice. By the way, I finally adopted a greyhound last weekend. His name is Biscuit."),
        (0, "A greyhound named Biscuit! How old is he?"),
        (
            1,
            "Biscuit is four years old and retired from racing. He sleeps about eighteen hours "
            "a day.",
        ),
        (0, "Ha, my kind of dog. I'm still training for the Lisbon half marathon in October."),
        (1, "What's your target time again?"),
        (0, "I want to finish under two hours. My best so far is two hours and six minutes."),
        (1, "You'll get there. Talk soon!"),
    ]
    s2: list[ScriptedTurn] = [
        (1, "Hey Mira, are we still on for the camping trip?"),
        (0, "Absolutely. Let's go camping at Lake Vilar on the first weekend of May."),
        (1, "Perfect. I bought a green two-person tent for 180 euros yesterday."),
        (0, "Fancy! I'll bring the stove and the coffee."),
        (1, "Can Biscuit come along? He's great on a leash."),
        (0, "Of course, as long as he doesn't chase the ducks."),
        (1, "No promises. How is work at the estuary?"),
        (
            0,
            "Busy. As a marine biologist I spend most mornings counting octopuses in the "
            "estuary near Aveiro.",
        ),
        (1, "Counting octopuses sounds like a dream job."),
        (0, "It is, until the boat engine breaks down."),
        (1, "On another note, my community orchestra has a concert on 10 June."),
        (0, "You still play the cello there?"),
        (1, "Yes, the cello, every Thursday night rehearsal at the old fire station."),
        (0, "I'll be in the front row. Which pieces are you playing?"),
        (1, "Mostly Dvorak, and I have a short solo in the second movement."),
        (0, "A solo! You kept that quiet."),
        (1, "I'm nervous about it, to be honest."),
        (0, "You'll be great. What should I pack for the lake besides the stove?"),
        (1, "Warm socks. Lake Vilar gets cold at night."),
        (0, "Noted. I'll also pack my binoculars for birdwatching."),
        (1, "Good idea, there are herons there."),
        (0, "Do you want me to drive? My van fits the tent and Biscuit."),
        (1, "That would be great, thanks."),
        (0, "Then it's settled. See you on the first weekend of May!"),
    ]
    s3: list[ScriptedTurn] = [
        (1, "That camping trip was the best weekend in months."),
        (0, "Agreed! I still can't believe we saw a red fox by the tent at Lake Vilar."),
        (1, "Biscuit was too sleepy to even notice the fox."),
        (
            0,
            "Typical Biscuit. Guess what, I ran a training half marathon in one hour and "
            "fifty-eight minutes last Sunday.",
        ),
        (1, "Under two hours! Congratulations!"),
        (
            0,
            "Thanks! Also, Lena is visiting me on 20 June and bringing a mug she made at the "
            "ceramics studio.",
        ),
        (1, "Lovely. I'm teaching Biscuit to sit; he learned it in three days."),
        (0, "Smart dog."),
    ]
    s4: list[ScriptedTurn] = [
        (
            0,
            "Look at the mug Lena made for me!",
            "mug.jpg",
            "a photo of a blue ceramic mug with a white fish painted on it",
        ),
        (1, "Beautiful, the fish looks like a sardine. How was her visit?"),
        (0, "Wonderful, we went to the beach every day."),
        (1, "The concert went well too. The solo in the Dvorak piece got a big applause."),
        (0, "I knew it! What's next for you?"),
        (
            1,
            "I'm starting Portuguese lessons every Tuesday evening, so I can talk to Lena "
            "when we visit Porto.",
        ),
        (0, "She'll love that."),
    ]
    return speakers, [
        ("9:15 am on 4 March, 2023", s1),
        ("7:40 pm on 18 April, 2023", s2),
        ("2:05 pm on 2 June, 2023", s3),
        ("11:30 am on 21 July, 2023", s4),
    ]


def _conv2() -> tuple[tuple[str, str], list[tuple[str, list[ScriptedTurn]]]]:
    speakers = ("Priya Nandakumar", "Jonas Feld")
    s1: list[ScriptedTurn] = [
        (0, "Hi Jonas! The community garden finally gave me plot number 27."),
        (1, "Congratulations, Priya! What are you going to grow?"),
        (0, "Tomatoes, obviously. I'm growing fourteen varieties of tomato this year."),
        (1, "Fourteen! I can barely keep a basil plant alive."),
        (0, "How is the novel going?"),
        (1, "Slowly. It's called The Salt Orchard, about a lighthouse keeper named Edda."),
        (0, "I love that title."),
        (
            1,
            "Thanks. Writing is easier since I moved from Hamburg to Leeds in 2021; the flat "
            "is quiet.",
        ),
        (0, "My daughter Asha just started violin lessons, so our flat is not quiet at all."),
        (1, "Ha! Tell her to practise scales."),
    ]
    s2: list[ScriptedTurn] = [
        (
            1,
            "Can I read you the first part of chapter three of The Salt Orchard? Here it goes: "
            + _chapter(1, 780),
        ),
        (0, "That's haunting. Please continue."),
        (1, "Part two: " + _chapter(2, 780)),
        (1, "And the last part of the chapter: " + _chapter(3, 780)),
        (0, "I got goosebumps. When will you send it to the publisher?"),
        (1, "My deadline is the end of September."),
    ]
    s3: list[ScriptedTurn] = [
        (1, "News: I submitted the manuscript of The Salt Orchard on 30 September 2023."),
        (0, "Amazing! We should celebrate."),
        (
            0,
            "Here's my harvest from plot 27.",
            "harvest.jpg",
            "a wooden crate full of red, yellow and striped tomatoes",
        ),
        (1, "What a harvest! Which variety was the best?"),
        (0, "A striped one called Green Zebra won the taste test with Asha."),
        (1, "How are her violin lessons going?"),
        (0, "She played her first concert at school last Friday, a short minuet."),
        (1, "Tell her congratulations from me."),
    ]
    return speakers, [
        ("6:20 pm on 12 August, 2023", s1),
        ("8:45 pm on 26 August, 2023", s2),
        ("10:10 am on 1 October, 2023", s3),
    ]


def _conv3() -> tuple[tuple[str, str], list[tuple[str, list[ScriptedTurn]]]]:
    speakers = ("Wen Li", "Kaito Mori")
    s1: list[ScriptedTurn] = [
        (0, "Happy new year, Kaito! How is the bakery?"),
        (1, "Busy! Since I opened the bakery Little Crane in November 2023, I get up at four."),
        (0, "What's the bestseller?"),
        (1, "A yuzu melon pan. I bake 120 loaves of bread every morning too."),
        (0, "I passed the JLPT N3 exam in December 2023, by the way."),
        (1, "おめでとう! 日本語の勉強は楽しいですか。"),
        (0, "はい、とても楽しいです! My cat Mochi sits on my textbooks while I study."),
        (1, "Mochi is a good study partner."),
    ]
    s2: list[ScriptedTurn] = [
        (
            0,
            "Mochi knocked my tea over again.",
            "mochi.jpg",
            "a grey cat sitting next to a spilled cup of tea on a desk",
        ),
        (1, "Ha, she looks proud of herself."),
        (0, "She is. Are you making anything special for spring?"),
        (1, "A sakura bread with cherry blossom paste, starting on 1 March."),
        (0, "I'll come to Little Crane to try it."),
        (1, "Bring your N2 textbook, I can quiz you."),
        (0, "Deal. I'm taking the N2 exam in July 2024."),
    ]
    s3: list[ScriptedTurn] = [
        (1, "Sorry for the late message, I just finished the night baking."),
        (0, "No worries. How did the sakura bread sell?"),
        (1, "We sold out every day of the first week."),
        (0, "I'm visiting Osaka in April with my brother Hao."),
        (1, "Come to Little Crane, the first yuzu melon pan is on the house."),
    ]
    return speakers, [
        ("4:50 pm on 5 January, 2024", s1),
        ("12:15 pm on 14 February, 2024", s2),
        ("12:05 am on 9 March, 2024", s3),
    ]


def _questions(sample: str) -> list[dict[str, Any]]:
    # (question, answer, category, evidence); category 5 answers go to adversarial_answer.
    table: dict[str, list[tuple[str, str | int, int, list[str]]]] = {
        "syn-1": [
            ("Where did Mira's sister Lena move to?", "Porto", 4, ["D1:1"]),
            ("What is the name of Tomas's greyhound?", "Biscuit", 4, ["D1:4"]),
            ("How old is Biscuit?", 4, 4, ["D1:6"]),
            ("How much did Tomas pay for his new tent?", "180 euros", 4, ["D2:3"]),
            ("When did Lena move to Porto?", "March 2023", 2, ["D1:1"]),
            (
                "When did Mira and Tomas go camping at Lake Vilar?",
                "the first weekend of May 2023",
                2,
                ["D2:2", "D3:2"],
            ),
            ("When is Lena visiting Mira?", "20 June 2023", 2, ["D3:6"]),
            (
                "What animal did Mira and Tomas see on their camping trip, and where?",
                "a red fox, at Lake Vilar",
                1,
                ["D2:2", "D3:2"],
            ),
            (
                "How does Lena's job relate to the gift she gave Mira?",
                "Lena works at a ceramics studio and made Mira a ceramic mug there",
                1,
                ["D1:1", "D3:6", "D4:1"],
            ),
            (
                "Did Mira reach her half marathon goal time in training?",
                "Yes, she ran one hour and fifty-eight minutes, under her two-hour goal",
                1,
                ["D1:9", "D3:4"],
            ),
            (
                "Which instrument does Tomas play, and when was his concert?",
                "the cello; the concert was on 10 June 2023",
                1,
                ["D2:12", "D2:11"],
            ),
            (
                "Why might Tomas's Portuguese lessons be useful on a trip to Porto?",
                "so he can talk to Lena, who lives in Porto",
                3,
                ["D4:6", "D1:1"],
            ),
            (
                "Would Mira likely enjoy a trip to an aquarium?",
                "Likely yes; she is a marine biologist who studies octopuses",
                3,
                ["D2:8"],
            ),
            ("What is the name of Mira's greyhound?", "Biscuit", 5, ["D1:4"]),
            (
                "What instrument does Mira play in the community orchestra?",
                "the cello",
                5,
                ["D2:12"],
            ),
        ],
        "syn-2": [
            ("How many varieties of tomato is Priya growing?", "fourteen", 4, ["D1:3"]),
            ("What is the title of Jonas's novel?", "The Salt Orchard", 4, ["D1:6"]),
            ("Which garden plot number did Priya get?", "27", 4, ["D1:1"]),
            ("When did Jonas move from Hamburg to Leeds?", "2021", 2, ["D1:8"]),
            ("When did Jonas submit his manuscript?", "30 September 2023", 2, ["D3:1"]),
            (
                "Who is the main character of the novel Jonas submitted in September 2023?",
                "Edda, a lighthouse keeper",
                1,
                ["D1:6", "D3:1"],
            ),
            (
                "Would Priya likely know how to make tomato sauce from her own garden?",
                "Likely yes; she grows fourteen tomato varieties on her own plot",
                3,
                ["D1:3"],
            ),
            ("Which tomato variety did Jonas grow on plot 27?", "Green Zebra", 5, ["D3:5"]),
        ],
        "syn-3": [
            ("What is the name of Kaito's bakery?", "Little Crane", 4, ["D1:2"]),
            ("What is the name of Wen's cat?", "Mochi", 4, ["D1:7"]),
            ("When did Kaito open his bakery?", "November 2023", 2, ["D1:2"]),
            (
                "Which JLPT level did Wen pass and which one is she taking next?",
                "She passed N3 in December 2023 and is taking N2 in July 2024",
                1,
                ["D1:5", "D2:7"],
            ),
            ("When is Wen visiting Osaka?", "April 2024", 2, ["D3:4"]),
            (
                "Is Kaito likely to be awake early in the morning?",
                "Yes; he gets up at four to bake",
                3,
                ["D1:2"],
            ),
            ("What is the name of Kaito's cat?", "Mochi", 5, ["D1:7"]),
        ],
    }
    questions: list[dict[str, Any]] = []
    for question, answer, category, evidence in table[sample]:
        item: dict[str, Any] = {"question": question}
        if category == 5:
            item["adversarial_answer"] = answer
        else:
            item["answer"] = answer
        item["evidence"] = evidence
        item["category"] = category
        questions.append(item)
    return questions


def _turn(
    session: int, number: int, speakers: tuple[str, str], scripted: ScriptedTurn
) -> dict[str, Any]:
    turn: dict[str, Any] = {
        "speaker": speakers[scripted[0]],
        "dia_id": f"D{session}:{number}",
        "text": scripted[1],
    }
    if len(scripted) == 4:
        turn["img_url"] = [IMAGE_BASE + scripted[2]]
        turn["blip_caption"] = scripted[3]
    return turn


def build() -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = []
    for sample_id, make in (("syn-1", _conv1), ("syn-2", _conv2), ("syn-3", _conv3)):
        speakers, sessions = make()
        conversation: dict[str, Any] = {"speaker_a": speakers[0], "speaker_b": speakers[1]}
        for number, (date_text, turns) in enumerate(sessions, start=1):
            conversation[f"session_{number}_date_time"] = date_text
            conversation[f"session_{number}"] = [
                _turn(number, index, speakers, scripted)
                for index, scripted in enumerate(turns, start=1)
            ]
        if sample_id == "syn-3":
            # LoCoMo quirks the loader must tolerate: an empty session and a dangling date.
            conversation["session_4_date_time"] = "9:00 am on 30 March, 2024"
            conversation["session_4"] = []
            conversation["session_5_date_time"] = "9:00 am on 6 April, 2024"
        samples.append(
            {"sample_id": sample_id, "conversation": conversation, "qa": _questions(sample_id)}
        )
    return samples


def render() -> bytes:
    return (json.dumps(build(), indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def main(argv: list[str]) -> int:
    content = render()
    if "--check" in argv:
        same = OUTPUT.is_file() and OUTPUT.read_bytes() == content
        print("up to date" if same else f"{OUTPUT.name} differs from the generator output")
        return 0 if same else 1
    OUTPUT.write_bytes(content)
    print(
        f"wrote {OUTPUT.name}: {len(content)} bytes, sha256 {hashlib.sha256(content).hexdigest()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
