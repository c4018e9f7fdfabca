"""ATM-Bench's videos as sampled frames, rule ``frames-v1`` (:data:`FRAMES_VERSION`).

A participant's Add carries images, not videos, so a video memory unit is sent as still frames
sampled the way ATM-Bench samples them for its answer models.

**Count.** :data:`FRAME_COUNT` (8) frames: the ``num_frames`` of ATM-Bench's MMRAG baseline
(``memqa/qa_agent_baselines/MMRag/config.py``) and of its video processor
(``memqa/global_config.py``, ``VIDEO_PROCESSING_CONFIG["frame_extraction"]``), which is also
AML's :data:`aml_evaluation.media.MAX_IMAGES_PER_MESSAGE`, so one unit's frames fit one message.

**Timestamps.** ATM-Bench's ``uniform`` strategy (``memqa/mem_processor/video/utils.py``,
``extract_frames``): for ``N`` frames of a video lasting ``duration`` seconds, the frames at
``i * duration / (N + 1)`` for ``i = 1..N``, measured from the start of the file (ffmpeg's
``-ss`` before ``-i``, which the benchmark runs, counts from the container's start time).
``duration`` is the container's (ffprobe's ``format.duration``, which the benchmark reads). A
container that gives no positive duration is handled as the benchmark handles it: ``duration``
1 s and ``N`` 1, so one frame, at 0.5 s.

**Which frame.** For each timestamp, the first decoded frame whose presentation time is at or
after it: the demuxer seeks backward to the keyframe before the timestamp, then frames are
decoded forward. When the stream ends before the timestamp, the last frame decoded is taken.
A frame without a presentation time is never taken for a timestamp, only as that last frame.

**Bytes.** Each frame is turned upright by the stream's display rotation (as the ffmpeg command
line the benchmark runs does by default; multiples of 90 degrees), converted to RGB (PyAV's
``to_image``), scaled with Lanczos to at most :data:`aml_evaluation.media.FIT_LONG_SIDE` pixels
on its long side and :data:`aml_evaluation.media.FIT_SHORT_SIDE` on its short side (never
enlarged; what rule ``fit-v1`` scales an image to, so 8 frames fit an Add's byte limit), and
written as baseline JPEG at quality :data:`JPEG_QUALITY` (90) with 4:2:0 subsampling and no
optimisation pass. The bytes follow from the video and the pinned PyAV (``av==18.1.0``, with the
FFmpeg it carries) and Pillow (``pillow==12.3.0``).

**Refused.** A video that is empty, over :data:`MAX_VIDEO_BYTES` (the benchmark's own
``max_video_size``, 500 MB), does not open or decode, has no video stream, yields no frame, is
larger than ``max_pixels`` per frame (default :data:`aml_evaluation.media.MAX_SOURCE_PIXELS`,
checked on the stream's declared size before decoding and on every frame decoded), or needs more
than ``max_decoded_frames`` decoded frames in all (bounded work), raises :class:`VideoError`
(a ValueError) naming the video.

Pure: bytes in, bytes out.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from fractions import Fraction
from types import MappingProxyType
from typing import Final

import av
from av.container import InputContainer
from av.video.frame import VideoFrame
from av.video.stream import VideoStream
from PIL import Image

from aml_evaluation.media import (
    FIT_LONG_SIDE,
    FIT_SHORT_SIDE,
    MAX_IMAGES_PER_MESSAGE,
    MAX_SOURCE_PIXELS,
    MIB,
)

FRAMES_VERSION: Final = "frames-v1"
FRAME_COUNT: Final = 8
JPEG_QUALITY: Final = 90
MAX_VIDEO_BYTES: Final = 500 * MIB
# Decoded frames per video, over all its timestamps: a phone video with a keyframe every few
# seconds needs a few hundred at most.
MAX_DECODED_FRAMES: Final = 20_000
# The benchmark's fallback when the container gives no duration (see the module docstring).
UNKNOWN_DURATION: Final = 1.0
_QUARTER_TURNS: Final = MappingProxyType(
    {
        90: Image.Transpose.ROTATE_90,
        -90: Image.Transpose.ROTATE_270,
        270: Image.Transpose.ROTATE_270,
        180: Image.Transpose.ROTATE_180,
        -180: Image.Transpose.ROTATE_180,
    }
)


class VideoError(ValueError):
    """A video AML refuses to sample (see the module docstring); the message names it."""


def frame_timestamps(duration: float | None, count: int = FRAME_COUNT) -> list[float]:
    """The seconds (from the file's start) of the frames sampled: ``i * duration / (count + 1)``
    for ``i = 1..count``; one at 0.5 s when the duration is unknown or not positive."""
    if duration is None or duration <= 0:
        duration, count = UNKNOWN_DURATION, 1
    return [i * duration / (count + 1) for i in range(1, count + 1)]


def sample_frames(
    name: str,
    video: bytes,
    count: int = FRAME_COUNT,
    *,
    max_pixels: int = MAX_SOURCE_PIXELS,
    max_decoded_frames: int = MAX_DECODED_FRAMES,
) -> list[bytes]:
    """The JPEG bytes of a video's sampled frames, in time order (rule ``frames-v1``, see the
    module docstring); VideoError naming ``name`` when the video is refused."""
    if not 1 <= count <= MAX_IMAGES_PER_MESSAGE:
        raise ValueError(f"frame count {count} is not 1 to {MAX_IMAGES_PER_MESSAGE}")
    if not video:
        raise VideoError(f"video {name!r} is empty")
    if len(video) > MAX_VIDEO_BYTES:
        raise VideoError(
            f"video {name!r} is {len(video)} bytes, over the {MAX_VIDEO_BYTES // MIB} MiB limit"
        )
    try:
        with av.open(io.BytesIO(video), mode="r") as container:
            return _sample(name, container, count, max_pixels, max_decoded_frames)
    except VideoError:
        raise
    except (av.FFmpegError, OSError, ValueError, EOFError, IndexError) as error:
        raise VideoError(f"video {name!r} does not decode: {error}") from None


def _sample(
    name: str, container: InputContainer, count: int, max_pixels: int, max_decoded: int
) -> list[bytes]:
    if not container.streams.video:
        raise VideoError(f"video {name!r} has no video stream")
    stream = container.streams.video[0]
    width, height = stream.codec_context.width, stream.codec_context.height
    if width * height > max_pixels:
        raise VideoError(
            f"video {name!r} is {width}x{height} pixels, over the {max_pixels:,} pixel limit"
        )
    duration = None if container.duration is None else container.duration / av.time_base
    start = 0.0 if container.start_time is None else container.start_time / av.time_base
    budget = _Budget(name, max_decoded)
    frames: list[bytes] = []
    for timestamp in frame_timestamps(duration, count):
        frame = _frame_at(name, container, stream, start + timestamp, budget, max_pixels)
        frames.append(_jpeg(frame))
    return frames


class _Budget:
    """Decoded frames left for one video."""

    def __init__(self, name: str, frames: int) -> None:
        self.name = name
        self.limit = frames
        self.used = 0

    def spend(self) -> None:
        self.used += 1
        if self.used > self.limit:
            raise VideoError(
                f"video {self.name!r} needs more than {self.limit} decoded frames to sample"
            )


def _frame_at(
    name: str,
    container: InputContainer,
    stream: VideoStream,
    seconds: float,
    budget: _Budget,
    max_pixels: int,
) -> VideoFrame:
    """The first frame at or after ``seconds`` (else the last one), decoding forward from the
    keyframe before it."""
    time_base = stream.time_base or Fraction(1, av.time_base)
    container.seek(int(seconds / time_base), stream=stream, backward=True, any_frame=False)
    last: VideoFrame | None = None
    for frame in _decoded(container, stream):
        budget.spend()
        if frame.width * frame.height > max_pixels:
            raise VideoError(
                f"video {name!r} has a {frame.width}x{frame.height} frame, over the "
                f"{max_pixels:,} pixel limit"
            )
        last = frame
        if frame.time is not None and frame.time >= seconds:
            return frame
    if last is None:
        raise VideoError(f"video {name!r} yields no frame at or before {seconds:.3f} s")
    return last


def _decoded(container: InputContainer, stream: VideoStream) -> Iterator[VideoFrame]:
    for packet in container.demux(stream):
        for frame in packet.decode():
            if isinstance(frame, VideoFrame):
                yield frame


def _jpeg(frame: VideoFrame) -> bytes:
    # PyAV declares no types for to_image.
    image = frame.to_image().convert("RGB")  # type: ignore[no-untyped-call]
    turn = _QUARTER_TURNS.get(round(frame.rotation))
    if turn is not None:
        image = image.transpose(turn)
    width, height = image.size
    scale = min(1.0, FIT_LONG_SIDE / max(width, height), FIT_SHORT_SIDE / min(width, height))
    if scale < 1.0:
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        image = image.resize(size, Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(
        out,
        format="JPEG",
        quality=JPEG_QUALITY,
        subsampling="4:2:0",
        optimize=False,
        progressive=False,
    )
    return out.getvalue()
