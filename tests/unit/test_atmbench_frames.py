"""ATM-Bench's video frames (aml_evaluation.atmbench.frames, rule frames-v1) on the synthetic
four-colour video."""

from __future__ import annotations

import io
import math

import av
import pytest
from PIL import Image

from aml_evaluation.atmbench import synthetic
from aml_evaluation.atmbench.frames import (
    FRAME_COUNT,
    FRAMES_VERSION,
    VideoError,
    frame_timestamps,
    sample_frames,
)
from aml_evaluation.media import JPEG, MAX_IMAGES_PER_MESSAGE, sniff_image_type

VIDEO = synthetic.video()
DURATION = len(synthetic.VIDEO_COLOURS) * synthetic.VIDEO_SEGMENT_FRAMES / synthetic.VIDEO_FPS


def centre(jpeg: bytes) -> tuple[int, int, int]:
    with Image.open(io.BytesIO(jpeg)) as image:
        pixel = image.convert("RGB").getpixel((image.width // 2, image.height // 2))
    assert isinstance(pixel, tuple)
    return (int(pixel[0]), int(pixel[1]), int(pixel[2]))


def nearest_colour(pixel: tuple[int, int, int]) -> tuple[int, int, int]:
    def distance(colour: tuple[int, int, int]) -> int:
        return sum((a - b) ** 2 for a, b in zip(colour, pixel, strict=True))

    return min(synthetic.VIDEO_COLOURS, key=distance)


def test_the_rule_is_named_and_takes_the_benchmarks_eight_frames() -> None:
    assert FRAMES_VERSION == "frames-v1"
    assert FRAME_COUNT == 8 == MAX_IMAGES_PER_MESSAGE


def test_timestamps_are_the_benchmarks_uniform_ones() -> None:
    assert frame_timestamps(9.0, 8) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert frame_timestamps(2.0, 3) == [0.5, 1.0, 1.5]
    # No duration: the benchmark's fallback, one frame at 0.5 s.
    assert frame_timestamps(None) == [0.5]
    assert frame_timestamps(0.0, 8) == [0.5]


def test_each_frame_is_the_first_at_or_after_its_timestamp() -> None:
    frames = sample_frames("v.mp4", VIDEO)
    assert len(frames) == FRAME_COUNT
    assert all(sniff_image_type(frame) == JPEG for frame in frames)
    for frame in frames:
        with Image.open(io.BytesIO(frame)) as image:
            assert image.size == synthetic.VIDEO_SIZE
    expected = []
    for seconds in frame_timestamps(DURATION):
        index = math.ceil(round(seconds * synthetic.VIDEO_FPS, 9))
        expected.append(synthetic.VIDEO_COLOURS[index // synthetic.VIDEO_SEGMENT_FRAMES])
    got = [nearest_colour(centre(frame)) for frame in frames]
    assert got == expected
    # Every coloured segment is seen, and frames of different segments differ.
    assert set(got) == set(synthetic.VIDEO_COLOURS)
    assert frames[0] != frames[-1]


def test_frames_are_the_same_bytes_every_time() -> None:
    assert sample_frames("v.mp4", VIDEO) == sample_frames("v.mp4", bytes(VIDEO))
    assert synthetic.video() == VIDEO


def test_fewer_frames_may_be_asked_for_within_a_message() -> None:
    three = sample_frames("v.mp4", VIDEO, 3)
    assert [nearest_colour(centre(frame)) for frame in three] == [
        synthetic.GREEN,
        synthetic.BLUE,
        synthetic.YELLOW,
    ]
    with pytest.raises(ValueError, match="frame count 9"):
        sample_frames("v.mp4", VIDEO, MAX_IMAGES_PER_MESSAGE + 1)
    with pytest.raises(ValueError, match="frame count 0"):
        sample_frames("v.mp4", VIDEO, 0)


@pytest.mark.parametrize(
    ("video", "message"),
    [
        (b"", "is empty"),
        (b"not a video at all" * 10, "does not decode"),
        (VIDEO[: len(VIDEO) // 3], "'v.mp4'"),
    ],
)
def test_garbage_and_truncated_videos_are_refused(video: bytes, message: str) -> None:
    with pytest.raises(VideoError, match=message):
        sample_frames("v.mp4", video)


def test_a_video_over_the_pixel_limit_is_refused_before_decoding() -> None:
    width, height = synthetic.VIDEO_SIZE
    with pytest.raises(VideoError, match=f"'v.mp4' is {width}x{height} pixels, over the"):
        sample_frames("v.mp4", VIDEO, max_pixels=width * height - 1)


def test_decoding_is_bounded() -> None:
    with pytest.raises(VideoError, match="needs more than 3 decoded frames"):
        sample_frames("v.mp4", VIDEO, max_decoded_frames=3)


def test_a_file_without_a_video_stream_is_refused() -> None:
    out = io.BytesIO()

    with av.open(out, mode="w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame(format="s16", layout="mono", samples=800)
        for plane in frame.planes:
            plane.update(bytes(plane.buffer_size))
        frame.sample_rate = 8000
        frame.pts = 0
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    with pytest.raises(VideoError, match="has no video stream"):
        sample_frames("a.mp4", out.getvalue())
