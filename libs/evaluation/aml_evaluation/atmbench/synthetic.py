"""Small bundles in ATM-Bench's layout (:mod:`aml_evaluation.atmbench.dataset`), for tests.

Everything here is invented and nothing is random: :func:`write_bundle` writes the same bytes on
every run (the images by the pinned Pillow, the video by the pinned PyAV's FFmpeg, single
threaded, with its bit-exact flags). The bundle holds:

- ``atm-bench.json``: nine QA records, three per answer type (``number``, ``list_recall``,
  ``open_end``; two carry ``qtype``, the rest leave the type to be told from the answer), whose
  evidence is emails, images and the video; one list_recall answer names two image ids, and one
  record carries the hard split's ``niah_evidence_ids``;
- ``email/emails.json``: three emails;
- ``image/``: three 96x64 images (two PNG, one JPEG) of distinct colours and shapes, and
  ``image/batch_results.json`` describing them;
- ``video/``: one 2 s, 64x48, 10 fps MPEG-4 Part 2 video in MP4 whose four 0.5 s segments are
  solid red, green, blue and yellow (a keyframe every 5 frames), and
  ``video/batch_results.json`` describing it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import av
from av.video.stream import VideoStream
from PIL import Image, ImageDraw

RGB = tuple[int, int, int]
RED: Final[RGB] = (220, 30, 30)
GREEN: Final[RGB] = (30, 160, 60)
BLUE: Final[RGB] = (30, 60, 200)
YELLOW: Final[RGB] = (240, 210, 30)
WHITE: Final[RGB] = (255, 255, 255)

QA_FILE: Final = "atm-bench.json"
EMAILS_FILE: Final = "email/emails.json"
IMAGE_BATCH_FILE: Final = "image/batch_results.json"
VIDEO_BATCH_FILE: Final = "video/batch_results.json"

EMAIL_IDS: Final = ("email202203140001", "email202207020001", "email202301200001")
IMAGE_IDS: Final = ("20220430_132212", "20220502_172850", "20230115_090000")
VIDEO_ID: Final = "20221224_180000"
VIDEO_FILE: Final = f"video/{VIDEO_ID}.mp4"
# The video's colour segments, in order, each VIDEO_SEGMENT_FRAMES frames long.
VIDEO_COLOURS: Final[tuple[RGB, ...]] = (RED, GREEN, BLUE, YELLOW)
VIDEO_FPS: Final = 10
VIDEO_SEGMENT_FRAMES: Final = 5
VIDEO_SIZE: Final = (64, 48)
IMAGE_SIZE: Final = (96, 64)

Draw = Callable[[ImageDraw.ImageDraw], None]


def _gradient(colour: RGB) -> Image.Image:
    """A left-to-right shade of ``colour`` (some texture, so the files weigh a few KB)."""
    width, height = IMAGE_SIZE
    image = Image.new("RGB", IMAGE_SIZE)
    pixels = [
        tuple(
            min(255, channel * (width + x) // (width + width // 2) + (y % 7)) for channel in colour
        )
        for y in range(height)
        for x in range(width)
    ]
    image.putdata(pixels)
    return image


def _image(colour: RGB, draw: Draw, image_format: str) -> bytes:
    image = _gradient(colour)
    draw(ImageDraw.Draw(image))
    out = io.BytesIO()
    if image_format == "PNG":
        image.save(out, format="PNG", optimize=False, compress_level=6)
    else:
        image.save(out, format="JPEG", quality=90, optimize=False, progressive=False)
    return out.getvalue()


def images() -> dict[str, bytes]:
    """Bundle path -> bytes of the three images."""
    return {
        f"image/{IMAGE_IDS[0]}.png": _image(
            RED, lambda d: d.ellipse((28, 12, 68, 52), fill=WHITE), "PNG"
        ),
        f"image/{IMAGE_IDS[1]}.jpg": _image(
            GREEN, lambda d: d.rectangle((20, 16, 76, 48), fill=YELLOW), "JPEG"
        ),
        f"image/{IMAGE_IDS[2]}.png": _image(
            BLUE, lambda d: d.polygon([(48, 8), (84, 56), (12, 56)], fill=WHITE), "PNG"
        ),
    }


def video() -> bytes:
    """The MP4 bytes of the four-colour video."""
    out = io.BytesIO()
    options = {"fflags": "+bitexact", "flags": "+bitexact"}
    with av.open(out, mode="w", format="mp4", options={"fflags": "+bitexact"}) as container:
        stream = container.add_stream("mpeg4", rate=VIDEO_FPS, options=options)
        assert isinstance(stream, VideoStream)
        stream.width, stream.height = VIDEO_SIZE
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = VIDEO_SEGMENT_FRAMES
        stream.codec_context.max_b_frames = 0
        stream.codec_context.thread_count = 1
        stream.codec_context.time_base = Fraction(1, VIDEO_FPS)
        index = 0
        for colour in VIDEO_COLOURS:
            for _ in range(VIDEO_SEGMENT_FRAMES):
                picture = Image.new("RGB", VIDEO_SIZE, colour)
                frame = av.VideoFrame.from_image(picture)  # type: ignore[no-untyped-call]
                frame.pts = index
                frame.time_base = Fraction(1, VIDEO_FPS)
                container.mux(stream.encode(frame))
                index += 1
        container.mux(stream.encode(None))
    return out.getvalue()


def emails() -> list[dict[str, str]]:
    return [
        {
            "id": EMAIL_IDS[0],
            "timestamp": "2022-03-14 09:15:00",
            "short_summary": "Booking confirmed: 3 nights at the Harbour Inn, Bristol",
            "detail": "Subject: Your booking\nDear guest, your stay from 15 to 18 March 2022 at "
            "the Harbour Inn is confirmed. Total paid: GBP 240.",
        },
        {
            "id": EMAIL_IDS[1],
            "timestamp": "2022-07-02 18:40:12",
            "short_summary": "Order shipped: a blue rain jacket",
            "detail": "Subject: Your order has shipped\nYour blue rain jacket (size M, GBP 65) "
            "is on its way.",
        },
        {
            "id": EMAIL_IDS[2],
            "timestamp": "",
            "short_summary": "Gym membership renewed for 12 months",
            "detail": "Subject: Membership renewal\nYour membership at City Gym has been renewed "
            "until January 2024.",
        },
    ]


def image_batch_results() -> list[dict[str, Any]]:
    return [
        {
            "image_path": f"/data/raw_memory/image/{IMAGE_IDS[0]}.png",
            "timestamp": "2022-04-30 13:22:12",
            "location_name": "Cambridge, United Kingdom",
            "short_caption": "A white circle on a red poster",
            "caption": "A red poster with a large white circle in the middle.",
            "ocr_text": "",
            "tags": ["poster", "red", "circle"],
        },
        {
            "image_path": f"/data/raw_memory/image/{IMAGE_IDS[1]}.jpg",
            "timestamp": "2022-05-02 17:28:50",
            "location_name": "London, United Kingdom",
            "short_caption": "A yellow box on a green table",
            "caption": "A yellow cardboard box on a green table.",
            "ocr_text": "FRAGILE",
            "tags": ["box", "yellow"],
        },
        {
            # No timestamp: the parser dates it by its id.
            "image_path": f"/data/raw_memory/image/{IMAGE_IDS[2]}.png",
            "location_name": "Oxford, United Kingdom",
            "short_caption": "A white triangle on a blue sign",
            "caption": "A blue road sign with a white triangle.",
            "ocr_text": "",
            "tags": "sign",
        },
    ]


def video_batch_results() -> list[dict[str, Any]]:
    return [
        {
            "video_path": f"/data/raw_memory/video/{VIDEO_ID}.mp4",
            "timestamp": "2022-12-24 18:00:00",
            "location_name": "Cambridge, United Kingdom",
            "short_caption": "Coloured lights changing",
            "caption": "Party lights turning red, then green, then blue, then yellow.",
            "ocr_text": "",
            "tags": ["lights", "party"],
        }
    ]


def qa_records() -> list[dict[str, Any]]:
    return [
        {
            "id": "q1",
            "question": "How much did I pay in total for the Harbour Inn stay?",
            "answer": "240",
            "evidence_ids": [EMAIL_IDS[0]],
            "qtype": "number",
        },
        {
            "id": "q2",
            "question": "How many nights did I book at the Harbour Inn?",
            "answer": "3",
            "evidence_ids": [EMAIL_IDS[0]],
        },
        {
            "id": "q3",
            "question": "How many colours did the party lights show in my Christmas Eve video?",
            "answer": "4",
            "evidence_ids": [VIDEO_ID],
        },
        {
            "id": "q4",
            "question": "Which photos from spring 2022 show a poster or a box?",
            "answer": f"{IMAGE_IDS[0]}, {IMAGE_IDS[1]}",
            "evidence_ids": [IMAGE_IDS[0], IMAGE_IDS[1]],
            "qtype": "list_recall",
        },
        {
            "id": "q5",
            "question": "Which emails are about purchases or bookings in 2022?",
            "answer": f"{EMAIL_IDS[0]}, {EMAIL_IDS[1]}",
            "evidence_ids": [EMAIL_IDS[0], EMAIL_IDS[1]],
        },
        {
            "id": "q6",
            "question": "Which of my photos were taken in Oxford or London?",
            "answer": f"{IMAGE_IDS[1]}, {IMAGE_IDS[2]}",
            "evidence_ids": [IMAGE_IDS[1], IMAGE_IDS[2]],
            "niah_evidence_ids": [IMAGE_IDS[1], IMAGE_IDS[2], IMAGE_IDS[0], EMAIL_IDS[2]],
        },
        {
            "id": "q7",
            "question": "What shape was on the red poster I photographed in Cambridge?",
            "answer": "A white circle",
            "evidence_ids": [IMAGE_IDS[0]],
        },
        {
            "id": "q8",
            "question": "What colour was the rain jacket I ordered, and what did it cost?",
            "answer": "It was blue and cost 65 pounds",
            "evidence_ids": [EMAIL_IDS[1]],
        },
        {
            "id": "q9",
            "question": "What was the last colour the party lights showed on Christmas Eve?",
            "answer": "Yellow",
            "evidence_ids": [VIDEO_ID],
        },
    ]


def _json(payload: object) -> bytes:
    return (json.dumps(payload, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def bundle_files() -> dict[str, bytes]:
    """Bundle path (POSIX, relative to the bundle directory) -> bytes, every file of the
    bundle."""
    files: dict[str, bytes] = {
        QA_FILE: _json(qa_records()),
        EMAILS_FILE: _json(emails()),
        IMAGE_BATCH_FILE: _json(image_batch_results()),
        VIDEO_BATCH_FILE: _json(video_batch_results()),
        VIDEO_FILE: video(),
    }
    files.update(images())
    return dict(sorted(files.items()))


def write_bundle(directory: Path, files: Mapping[str, bytes] | None = None) -> list[Path]:
    """Write the bundle (``files``, default :func:`bundle_files`) into ``directory`` (created if
    needed); the paths written, sorted."""
    written: list[Path] = []
    for name, content in (bundle_files() if files is None else files).items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        written.append(path)
    return sorted(written)


def contents(files: Mapping[str, bytes] | None = None, prefix: str = "") -> list[tuple[str, bytes]]:
    """The bundle as a parser's ``contents``: (``prefix`` + path, bytes), in path order."""
    chosen = bundle_files() if files is None else files
    return [(f"{prefix}{name}", chosen[name]) for name in sorted(chosen)]


def with_changes(changes: Mapping[str, bytes | None]) -> dict[str, bytes]:
    """The bundle's files with some replaced (path -> bytes) or removed (path -> None)."""
    files = bundle_files()
    for name, content in changes.items():
        if content is None:
            files.pop(name, None)
        else:
            files[name] = content
    return dict(sorted(files.items()))


def json_bytes(payload: Sequence[Any] | Mapping[str, Any]) -> bytes:
    """A JSON file's bytes as the bundle writes them (for tests that change one file)."""
    return _json(payload)
