"""Generator of the synthetic multimodal dataset (Mem-Gallery format), AML's own small public
benchmark of the multimodal track for smoke runs and tests.

Everything here is invented. Nothing is random, so running this script always writes the same
bytes: one dialog file per conversation, ``dialog/<conversation>.json``, their images under
``image/<conversation>/`` (the source's layout: a dialog file names ``../image/<conversation>/...``)
and the bundle manifest ``../manifests/synthetic_multimodal.json`` (shipped: the registry lists
it) with the sha256 of every file.
The outputs are committed next to this script; after any change, rerun it.

The images are 16x16 RGB PNGs of a solid colour or a simple pattern (stripes, a checkerboard, a
cross), which the questions ask about. They are written with ``zlib.crc32``/``zlib.adler32``
and ``struct`` only, and their pixel data is stored in uncompressed deflate blocks built here:
a compressor's output may differ between zlib builds, stored blocks cannot.

What the data is built to exercise: two conversations (two memory users) of three sessions
each, rounds with one image and one with two, questions over all nine task types, three of
them showing an image (``question_image``), an answer refusal (``"Not mentioned."``) and
visual-search answers naming image ids.

Usage: ``python generate.py`` rewrites the files; ``python generate.py --check`` exits 1 if a
committed file differs from what this script produces.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MANIFEST = HERE.parent / "manifests" / "synthetic_multimodal.json"
BUNDLE_DIR = "synthetic_multimodal"  # this directory, relative to the package data root
SIZE = 16

RGB = tuple[int, int, int]
RED: RGB = (220, 30, 30)
GREEN: RGB = (30, 160, 60)
BLUE: RGB = (30, 60, 200)
YELLOW: RGB = (240, 210, 30)
ORANGE: RGB = (245, 130, 20)
WHITE: RGB = (255, 255, 255)
BLACK: RGB = (0, 0, 0)

Pixel = Callable[[int, int], RGB]


def solid(color: RGB) -> Pixel:
    return lambda x, y: color


def stripes(first: RGB, second: RGB, width: int = 4) -> Pixel:
    """Horizontal stripes, ``width`` rows each."""
    return lambda x, y: first if (y // width) % 2 == 0 else second


def checkerboard(first: RGB, second: RGB, cell: int = 4) -> Pixel:
    return lambda x, y: first if (x // cell + y // cell) % 2 == 0 else second


def cross(background: RGB, bar: RGB, half: int = 2) -> Pixel:
    """A centred plus sign of bars ``2 * half`` pixels thick."""
    middle = SIZE // 2
    return lambda x, y: (
        bar if abs(x - middle + 0.5) < half or abs(y - middle + 0.5) < half else (background)
    )


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _stored_zlib(data: bytes) -> bytes:
    """A zlib stream of ``data`` in stored (uncompressed) deflate blocks."""
    out = bytearray(b"\x78\x01")
    blocks = [data[i : i + 65535] for i in range(0, len(data), 65535)] or [b""]
    for index, block in enumerate(blocks):
        final = 1 if index == len(blocks) - 1 else 0
        out += struct.pack("<BHH", final, len(block), len(block) ^ 0xFFFF) + block
    out += struct.pack(">I", zlib.adler32(data))
    return bytes(out)


def png(pixel: Pixel) -> bytes:
    """A SIZE x SIZE 8-bit RGB PNG (filter 0 on every row)."""
    raw = b"".join(b"\x00" + b"".join(bytes(pixel(x, y)) for x in range(SIZE)) for y in range(SIZE))
    header = struct.pack(">IIBBBBB", SIZE, SIZE, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", _stored_zlib(raw))
        + _chunk(b"IEND", b"")
    )


# A round: (user, assistant) or (user, assistant, [(image name, pattern, caption), ...]).
Image = tuple[str, Pixel, str]
Round = tuple[str, str] | tuple[str, str, list[Image]]
# A question: (point, question, answer, session ids, clue) or the same plus a question image.
QA = tuple[str, str, str, list[str], list[str]] | tuple[str, str, str, list[str], list[str], Image]


def _ada() -> tuple[dict[str, Any], list[tuple[str, list[Round]]], list[QA]]:
    profile = {
        "name": "Ada",
        "persona_summary": "Ada is a 31-year-old librarian who took up painting again this year.",
        "traits": ["curious", "patient"],
        "conversation_style": "Short, cheerful messages, often with a photo.",
    }
    d1: list[Round] = [
        (
            "I started painting again! This is the first canvas I finished this week.",
            "What a bold colour! A single strong colour can be very striking.",
            [("D1_IMG_001.png", solid(RED), "a square canvas painted solid red")],
        ),
        (
            "My painting teacher is called Mr. Okoye, and class is every Tuesday evening.",
            "Tuesday evenings are a nice way to break up the week.",
        ),
        (
            "And here is the scarf my sister knitted for me.",
            "Those stripes are lovely, it looks warm.",
            [("D1_IMG_002.png", stripes(BLUE, WHITE), "a scarf with blue and white stripes")],
        ),
    ]
    d2: list[Round] = [
        (
            "I painted a checkerboard study in black and white to practise straight edges.",
            "Straight edges are hard; that looks very clean.",
            [("D2_IMG_001.png", checkerboard(BLACK, WHITE), "a black and white checkerboard")],
        ),
        (
            "News: my painting class moved from Tuesday to Thursday evening.",
            "Thursday works too. Does Mr. Okoye still teach it?",
        ),
        ("Yes, same teacher, new day.", "Good to hear."),
    ]
    d3: list[Round] = [
        (
            "Two more canvases this month: a green one and a yellow one.",
            "You are on a roll! They would look good side by side.",
            [
                ("D3_IMG_001.png", solid(GREEN), "a square canvas painted solid green"),
                ("D3_IMG_002.png", solid(YELLOW), "a square canvas painted solid yellow"),
            ],
        ),
        ("I will hang them in the reading room of the library.", "Your readers will love it."),
    ]
    questions: list[QA] = [
        ("FR", "What is the name of Ada's painting teacher?", "Mr. Okoye", ["D1"], ["D1:2"]),
        (
            "VR",
            "Is the colour of this image the same as the first canvas Ada finished?",
            "Yes.",
            ["D1"],
            ["D1:1"],
            ("QA_IMG_001.png", solid(RED), "a square of solid red"),
        ),
        (
            "TR",
            "When did Ada share her checkerboard study? Return in the format YYYY-MM-DD.",
            "2024-03-18",
            ["D2"],
            ["D2:1"],
        ),
        (
            "KR",
            "On which evening is Ada's painting class now?",
            "Thursday",
            ["D1", "D2"],
            ["D1:2", "D2:2"],
        ),
        (
            "VS",
            "Please search for all images of canvases Ada painted in a single solid colour.",
            "D1:IMG_001, D3:IMG_001, D3:IMG_002",
            ["D1", "D3"],
            ["D1:1", "D3:1"],
        ),
        ("AR", "What is the name of Ada's sister?", "Not mentioned.", ["D1"], []),
    ]
    return profile, [("2024-03-04", d1), ("2024-03-18", d2), ("2024-04-02", d3)], questions


def _bruno() -> tuple[dict[str, Any], list[tuple[str, list[Round]]], list[QA]]:
    profile = {
        "name": "Bruno",
        "persona_summary": "Bruno is a 45-year-old bus driver who hikes and keeps an aquarium.",
        "traits": ["calm", "precise"],
        "conversation_style": "Matter-of-fact, likes numbers.",
    }
    d1: list[Round] = [
        (
            "This is the flag of my hiking club.",
            "A blue cross on yellow, easy to spot on a trail.",
            [("D1_IMG_001.png", cross(YELLOW, BLUE), "a yellow flag with a blue cross")],
        ),
        (
            "We hike every second Saturday; the next trail is Pico Alto.",
            "Pico Alto has great views from the top.",
        ),
    ]
    d2: list[Round] = [
        (
            "Meet my new fish, Pip.",
            "Pip is very bright!",
            [("D2_IMG_001.png", solid(ORANGE), "a bright orange fish filling the frame")],
        ),
        ("The aquarium holds 60 liters.", "That is plenty of room for Pip."),
    ]
    d3: list[Round] = [
        (
            "I put a new decoration in Pip's tank.",
            "A checkerboard tile, very stylish.",
            [("D3_IMG_001.png", checkerboard(BLUE, WHITE), "a blue and white checkered tile")],
        ),
        ("Our club hiked Pico Alto last Saturday.", "How was the weather?"),
        ("Sunny the whole way up.", "Perfect hiking weather."),
    ]
    questions: list[QA] = [
        ("FR", "How many liters does Bruno's aquarium hold?", "60 liters", ["D2"], ["D2:2"]),
        (
            "TTL",
            "Which group uses the flag shown in this image?",
            "Bruno's hiking club",
            ["D1"],
            ["D1:1"],
            ("QA_IMG_001.png", cross(YELLOW, BLUE), "a yellow flag with a blue cross"),
        ),
        (
            "CD",
            "Please determine whether the following information conflicts with the dialogue "
            "memory:\n Bruno's fish Pip is orange.",
            "No.",
            ["D2"],
            ["D2:1"],
        ),
        (
            "MR",
            "What is the name of Bruno's fish, and which trail did his club hike?",
            "Pip; Pico Alto",
            ["D2", "D3"],
            ["D2:1", "D3:2"],
        ),
        (
            "VR",
            "Does the object in this image have the same pattern as the decoration in Pip's tank?",
            "Yes.",
            ["D3"],
            ["D3:1"],
            ("QA_IMG_002.png", checkerboard(BLUE, WHITE), "a blue and white checkered square"),
        ),
    ]
    return profile, [("2024-05-10", d1), ("2024-05-25", d2), ("2024-06-08", d3)], questions


CONVERSATIONS = (("Ada_Painting_Library", _ada), ("Bruno_Hiking_Aquarium", _bruno))


def build() -> dict[str, bytes]:
    """Every output file (relative to this directory, except the manifest) and its bytes."""
    files: dict[str, bytes] = {}
    dialog: dict[str, Any] = {}
    for name, make in CONVERSATIONS:
        profile, sessions, questions = make()
        raw_sessions: list[dict[str, Any]] = []
        for number, (date, rounds) in enumerate(sessions, start=1):
            raw_rounds: list[dict[str, Any]] = []
            for index, scripted in enumerate(rounds, start=1):
                item: dict[str, Any] = {
                    "round": f"D{number}:{index}",
                    "user": scripted[0],
                    "assistant": scripted[1],
                }
                if len(scripted) == 3:
                    images = scripted[2]
                    item["image_id"] = [
                        f"D{number}:{image[0].split('_', 1)[1].rsplit('.', 1)[0]}"
                        for image in images
                    ]
                    item["input_image"] = [f"../image/{name}/{image[0]}" for image in images]
                    item["image_caption"] = [image[2] for image in images]
                    for image in images:
                        files[f"image/{name}/{image[0]}"] = png(image[1])
                raw_rounds.append(item)
            raw_sessions.append({"session_id": f"D{number}", "date": date, "dialogues": raw_rounds})
        raw_questions: list[dict[str, Any]] = []
        for qa in questions:
            point, question, answer, session_ids, clue = qa[:5]
            entry: dict[str, Any] = {"point": point, "question": question}
            if len(qa) == 6:
                image = qa[5]
                entry["question_image"] = f"../image/{name}/{image[0]}"
                files[f"image/{name}/{image[0]}"] = png(image[1])
            entry |= {"answer": answer, "session_id": session_ids, "clue": clue}
            if len(qa) == 6:
                entry["image_caption"] = qa[5][2]
            raw_questions.append(entry)
        dialog[name] = {
            "character_profile": profile,
            "multi_session_dialogues": raw_sessions,
            "human-annotated QAs": raw_questions,
        }
    # One file per conversation, as the source has it.
    outputs: dict[str, bytes] = {}
    for name, document in dialog.items():
        text = json.dumps(document, indent=1, ensure_ascii=False) + "\n"
        outputs[f"dialog/{name}.json"] = text.encode("utf-8")
    outputs |= dict(sorted(files.items()))
    return outputs


def manifest(files: dict[str, bytes]) -> bytes:
    """The bundle manifest (format "mem-gallery", track "multimodal"), files in path order."""
    payload = {
        "dataset_id": "synthetic_multimodal",
        "version": "v1",
        "format": "mem-gallery",
        "track": "multimodal",
        "scorer": "token_f1",
        "f1_variant": "f1-memgallery-v1",
        "categories": {
            "1": "factual-retrieval",
            "2": "multi-entity-reasoning",
            "3": "temporal-reasoning",
            "4": "visual-reasoning",
            "5": "test-time-learning",
            "6": "visual-search",
            "7": "conflict-detection",
            "8": "knowledge-resolution",
            "9": "answer-refusal",
        },
        "excluded_from_overall": [],
        "location": "package",
        "files": [
            {"path": f"{BUNDLE_DIR}/{path}", "sha256": hashlib.sha256(content).hexdigest()}
            for path, content in sorted(files.items())
        ],
    }
    return (json.dumps(payload, indent=2) + "\n").encode("utf-8")


def render() -> dict[Path, bytes]:
    files = build()
    out = {HERE / path: content for path, content in files.items()}
    out[MANIFEST] = manifest(files)
    return out


def main(argv: list[str]) -> int:
    outputs = render()
    if "--check" in argv:
        stale = [p for p, c in outputs.items() if not p.is_file() or p.read_bytes() != c]
        for path in stale:
            print(f"{path.relative_to(HERE.parent)} differs from the generator output")
        print("up to date" if not stale else f"{len(stale)} files differ")
        return 1 if stale else 0
    for path, content in outputs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    total = sum(len(content) for content in outputs.values())
    print(f"wrote {len(outputs)} files, {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
