"""Images of multimodal datasets: references, limits and ``data:`` URLs (SPEC R-4.4, R-4.5, R-4.7).

**References.** A dataset names an image by a *reference*: a relative POSIX path under the
dataset's image directory (``"Dog_Behavior_Research_Academic_Life/D1_IMG_001.jpg"``). A reference
is never absolute, never holds ``..``, a backslash, an empty or ``.`` part, or a control
character (:func:`check_reference`). :func:`resolve_image` resolves it under the image directory,
following symlinks, and refuses any result outside the directory: a symlink inside the directory
that points out of it is refused like ``..`` would be.

**Types.** The type is taken from the file's first bytes, never from its name: PNG, JPEG, GIF and
WebP only (:data:`IMAGE_TYPES`), the formats every vision API the participants use accepts.

**Limits.** An image reaches the participant inside an Add body (a ``data:<mime>;base64,...`` URL
in an ``image_url`` part), or inside a Search body when the question shows one. Base64 makes it
4/3 larger. The limits below keep those bodies within what the platform stores and carries:

- :data:`MAX_IMAGE_BYTES` (5 MiB) per image: the smallest per-image cap among the common vision
  APIs (Anthropic's is 5 MB; OpenAI's 20 MB), so a participant can forward an image unchanged.
- :data:`MAX_IMAGES_PER_MESSAGE` (8) images in one message.
- :data:`MAX_IMAGES_PER_ADD` (20) images and :data:`MAX_ADD_IMAGE_BYTES` (8 MiB, counted before
  base64) in one Add request. The scheduler stores every Add body, built once, in a MongoDB
  document (16 MiB at most); 8 MiB of images is about 10.7 MiB of base64, which leaves more than
  5 MiB for the rest of the document and the request's text (20 messages / 2,000 words at most).
  The participant client bounds what it *reads back* (Add answer 256 KiB, Search answer 4 MiB,
  ``aml_contract.participant.MAX_RESPONSE_BYTES``), not what it sends; these limits are the
  sending side's.
- :data:`MAX_IMAGES_PER_QUERY` (1) image and :data:`MAX_QUERY_IMAGE_BYTES` (512 KiB) in one
  Search request: its body travels inside the search-stage NATS message
  (``QuestionWork.search_body``), whose default size cap is 1 MiB; 512 KiB is about 683 KiB of
  base64, leaving room for the question's facts.

**Fitting** (rule ``fit-v1``, :func:`fit_image`). Real datasets hold larger images than that
(Mem-Gallery's question images reach 11 MB). An image over the limit of the place it is sent
to (5 MiB in an Add, 512 KiB in a Search) is sent *fitted*: decoded, turned upright by its EXIF
orientation, flattened onto white, scaled (Lanczos) to at most 2048 pixels on its long side and
768 on its short side, never enlarged, and written as baseline JPEG at the first quality of 85,
70, 55, 40 that fits. That is the size OpenAI's vision models scale an image to before they
look at it ("high" detail), so the answer model loses nothing it would have seen. The source
bytes are what the manifest pins (at most :data:`MAX_SOURCE_IMAGE_BYTES`, 64 MiB, and
:data:`MAX_SOURCE_PIXELS`); the fitted bytes follow from them and the pinned Pillow, so every
Add and Search carries the same bytes on every retry and every run. An image within its limit
is sent byte for byte as the dataset has it.

A limit that is broken (an image that does not decode, is too large even as a source, or does
not fit even at the lowest quality; too many images in one place) is an :class:`ImageError`
naming the image and the limit; nothing is ever truncated or dropped.

Everything here is pure (fitting included: bytes in, bytes out) except :func:`resolve_image`,
:func:`image_file_size` and :func:`read_image`, the edge that touches the file system.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
import stat
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Final

from PIL import Image, ImageOps

MIB: Final = 1024 * 1024
KIB: Final = 1024
MAX_IMAGE_BYTES: Final = 5 * MIB
MAX_IMAGES_PER_MESSAGE: Final = 8
MAX_IMAGES_PER_ADD: Final = 20
MAX_ADD_IMAGE_BYTES: Final = 8 * MIB
MAX_IMAGES_PER_QUERY: Final = 1
MAX_QUERY_IMAGE_BYTES: Final = 512 * KIB
MAX_REFERENCE_LENGTH: Final = 1024
# A dataset's own image files, before fitting.
MAX_SOURCE_IMAGE_BYTES: Final = 64 * MIB
# Below Pillow's own decompression-bomb threshold (89,478,485 pixels), so ours speaks first.
MAX_SOURCE_PIXELS: Final = 80_000_000
FIT_RULE: Final = "fit-v1"
FIT_LONG_SIDE: Final = 2048
FIT_SHORT_SIDE: Final = 768
FIT_QUALITIES: Final = (85, 70, 55, 40)

PNG: Final = "image/png"
JPEG: Final = "image/jpeg"
GIF: Final = "image/gif"
WEBP: Final = "image/webp"
# The MIME types AML sends, each with the usual file suffixes (informative: the type is taken
# from the bytes).
IMAGE_TYPES: Final[Mapping[str, tuple[str, ...]]] = {
    PNG: (".png",),
    JPEG: (".jpg", ".jpeg"),
    GIF: (".gif",),
    WEBP: (".webp",),
}
IMAGE_SUFFIXES: Final[frozenset[str]] = frozenset(
    suffix for suffixes in IMAGE_TYPES.values() for suffix in suffixes
)

_PNG_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"
_DATA_URL: Final = re.compile(r"data:(image/[a-z]+);base64,([A-Za-z0-9+/]*={0,2})")


class ImageError(ValueError):
    """An image reference or file AML refuses: bad reference, outside the image directory,
    missing, not an image of a supported type, or over a limit. The message names the image."""


class MissingImagesError(ValueError):
    """Images a dataset references are not there; ``missing`` lists their references."""

    def __init__(self, message: str, missing: Sequence[str]) -> None:
        super().__init__(message)
        self.missing = list(missing)


# --- pure -------------------------------------------------------------------------------------


def sniff_image_type(data: bytes) -> str | None:
    """The MIME type of an image from its magic bytes (PNG, JPEG, GIF, WebP), else None."""
    if data.startswith(_PNG_SIGNATURE):
        return PNG
    if data.startswith(b"\xff\xd8\xff"):
        return JPEG
    if data.startswith((b"GIF87a", b"GIF89a")):
        return GIF
    if len(data) >= 12 and data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return WEBP
    return None


def check_reference(reference: str) -> str:
    """The reference itself if it is a clean relative POSIX path (see the module docstring);
    ImageError otherwise."""
    if not reference or len(reference) > MAX_REFERENCE_LENGTH:
        raise ImageError(
            f"image reference {reference[:80]!r}: must be 1 to {MAX_REFERENCE_LENGTH} characters"
        )
    if any(not ch.isprintable() for ch in reference):
        raise ImageError(f"image reference {reference!r}: control characters are not allowed")
    if reference.startswith("/") or "\\" in reference:
        raise ImageError(
            f"image reference {reference!r}: must be a relative path with '/' separators"
        )
    parts = reference.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ImageError(
            f"image reference {reference!r}: empty, '.' or '..' path parts are not allowed"
        )
    return reference


def check_image(name: str, data: bytes, max_bytes: int = MAX_IMAGE_BYTES) -> str:
    """The MIME type of an image's bytes; ImageError if it is empty, over ``max_bytes`` or not a
    PNG, JPEG, GIF or WebP image."""
    if not data:
        raise ImageError(f"image {name!r} is empty")
    if len(data) > max_bytes:
        raise ImageError(
            f"image {name!r} is {len(data)} bytes, over the {_size(max_bytes)} per-image limit"
        )
    mime = sniff_image_type(data)
    if mime is None:
        raise ImageError(
            f"image {name!r} is not a PNG, JPEG, GIF or WebP image (first bytes {data[:8].hex()})"
        )
    return mime


def fit_image(name: str, data: bytes, max_bytes: int = MAX_IMAGE_BYTES) -> bytes:
    """The bytes to send of a dataset's image where at most ``max_bytes`` fit: ``data`` itself
    when it fits, else its fitted JPEG (rule ``fit-v1``, see the module docstring).
    ImageError when it is not a supported image, is over the source limits, does not decode,
    or does not fit even at the lowest quality."""
    if len(data) <= max_bytes:
        check_image(name, data, max_bytes)
        return data
    check_image(name, data, MAX_SOURCE_IMAGE_BYTES)
    too_large = f"over the {MAX_SOURCE_PIXELS:,} pixel limit of a dataset's images"
    try:
        with warnings.catch_warnings():
            # Pillow warns (then refuses) past its own pixel limit when it opens the file.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as source:
                width, height = source.size
                if width * height > MAX_SOURCE_PIXELS:
                    raise ImageError(f"image {name!r} is {width}x{height} pixels, {too_large}")
                flat = _on_white(ImageOps.exif_transpose(source))
    except ImageError:
        raise
    except (Image.DecompressionBombWarning, Image.DecompressionBombError):
        raise ImageError(f"image {name!r} is {too_large}") from None
    except (OSError, ValueError, SyntaxError) as error:
        raise ImageError(f"image {name!r} does not decode: {error}") from None
    width, height = flat.size
    scale = min(1.0, FIT_LONG_SIDE / max(width, height), FIT_SHORT_SIDE / min(width, height))
    if scale < 1.0:
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        flat = flat.resize(size, Image.Resampling.LANCZOS)
    for quality in FIT_QUALITIES:
        out = io.BytesIO()
        flat.save(out, format="JPEG", quality=quality, optimize=False, progressive=False)
        if out.tell() <= max_bytes:
            return out.getvalue()
    raise ImageError(
        f"image {name!r} does not fit {_size(max_bytes)} even fitted ({flat.width}x"
        f"{flat.height} JPEG at quality {FIT_QUALITIES[-1]}: {out.tell()} bytes)"
    )


def _on_white(image: Image.Image) -> Image.Image:
    """RGB, with any transparency composited onto white (JPEG has no alpha)."""
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def data_url(name: str, data: bytes, max_bytes: int = MAX_IMAGE_BYTES) -> str:
    """``data:<mime>;base64,<data>`` of a checked image (:func:`check_image`)."""
    mime = check_image(name, data, max_bytes)
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def parse_data_url(url: str) -> tuple[str, bytes]:
    """(MIME type, bytes) of a ``data:image/...;base64,...`` URL as :func:`data_url` writes it;
    ImageError for anything else, or when the declared type is not the bytes' type."""
    match = _DATA_URL.fullmatch(url)
    if match is None:
        raise ImageError(f"not a base64 image data URL: {url[:60]!r}")
    mime, payload = match.groups()
    try:
        data = base64.b64decode(payload, validate=True)
    except binascii.Error as error:
        raise ImageError(f"image data URL: bad base64: {error}") from None
    actual = sniff_image_type(data)
    if actual != mime:
        raise ImageError(f"image data URL declares {mime}, its bytes are {actual or 'unknown'}")
    return mime, data


def data_url_length(size: int, mime: str = JPEG) -> int:
    """Characters of the data URL of an image of ``size`` bytes (for body-size budgets)."""
    return len(f"data:{mime};base64,") + 4 * ((size + 2) // 3)


def check_image_budget(
    images: Sequence[tuple[str, int]], max_images: int, max_bytes: int, where: str
) -> None:
    """ImageError naming ``where`` and the limit when ``images`` ((reference, size in bytes),
    in order) are more than ``max_images`` or their sizes add up to more than ``max_bytes``."""
    if len(images) > max_images:
        names = ", ".join(repr(name) for name, _ in images[max_images:][:3])
        raise ImageError(
            f"{where}: {len(images)} images, over the limit of {max_images} "
            f"(first beyond it: {names})"
        )
    total = 0
    for name, size in images:
        total += size
        if total > max_bytes:
            raise ImageError(
                f"{where}: images add up to more than the {_size(max_bytes)} limit at image "
                f"{name!r} ({total} bytes so far)"
            )


def check_message_images(images: Sequence[tuple[str, int]], where: str) -> None:
    """The limits of one message (:data:`MAX_IMAGES_PER_MESSAGE`; bytes as an Add's)."""
    check_image_budget(images, MAX_IMAGES_PER_MESSAGE, MAX_ADD_IMAGE_BYTES, where)


def check_add_images(images: Sequence[tuple[str, int]], where: str) -> None:
    """The limits of one Add request (:data:`MAX_IMAGES_PER_ADD`, :data:`MAX_ADD_IMAGE_BYTES`)."""
    check_image_budget(images, MAX_IMAGES_PER_ADD, MAX_ADD_IMAGE_BYTES, where)


def check_query_images(images: Sequence[tuple[str, int]], where: str) -> None:
    """The limits of one Search request (:data:`MAX_IMAGES_PER_QUERY`,
    :data:`MAX_QUERY_IMAGE_BYTES`)."""
    check_image_budget(images, MAX_IMAGES_PER_QUERY, MAX_QUERY_IMAGE_BYTES, where)


def fits_in_add(count: int, total_bytes: int, add_count: int, add_bytes: int) -> bool:
    """Whether an Add holding ``count`` images of ``total_bytes`` can take a message with
    ``add_count`` more of ``add_bytes`` (a chunker starts a new Add when it cannot)."""
    return count + add_count <= MAX_IMAGES_PER_ADD and total_bytes + add_bytes <= (
        MAX_ADD_IMAGE_BYTES
    )


def _size(n: int) -> str:
    if n % MIB == 0:
        return f"{n // MIB} MiB"
    if n % KIB == 0:
        return f"{n // KIB} KiB"
    return f"{n} bytes"


# --- the file-system edge ---------------------------------------------------------------------


def resolve_image(image_dir: Path, reference: str) -> Path:
    """The regular file a reference names under ``image_dir``, symlinks resolved; ImageError if
    the reference is malformed, the file is missing or not a regular file, or it resolves
    outside the image directory (a ``..`` or a symlink escape)."""
    check_reference(reference)
    try:
        root = image_dir.resolve(strict=True)
    except OSError:
        raise ImageError(
            f"image {reference!r}: the image directory {image_dir} does not exist"
        ) from None
    try:
        path = (root / PurePosixPath(reference)).resolve(strict=True)
    except OSError:
        raise ImageError(f"image {reference!r} not found under {root}") from None
    if not path.is_relative_to(root):
        raise ImageError(
            f"image {reference!r} resolves to {path}, outside the image directory {root}"
        )
    if not path.is_file():
        raise ImageError(f"image {reference!r} at {path} is not a regular file")
    return path


def image_file_size(image_dir: Path, reference: str) -> int:
    """The size in bytes of a referenced image file (checked as :func:`resolve_image` does)."""
    return resolve_image(image_dir, reference).stat().st_size


def read_image(image_dir: Path, reference: str, max_bytes: int = MAX_IMAGE_BYTES) -> bytes:
    """The bytes of a referenced image, checked (:func:`check_image`). Never reads more than
    ``max_bytes`` + 1 bytes, so an oversized file is refused without being loaded; the resolved
    file is opened without following a symlink there, and must still be a regular file."""
    path = resolve_image(image_dir, reference)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as error:
        raise ImageError(f"image {reference!r} at {path}: {error.strerror}") from None
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise ImageError(f"image {reference!r} at {path} is not a regular file")
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ImageError(
            f"image {reference!r} at {path} is larger than the {_size(max_bytes)} per-image limit"
        )
    check_image(reference, data, max_bytes)
    return data


def image_data_url(image_dir: Path, reference: str, max_bytes: int = MAX_IMAGE_BYTES) -> str:
    """The ``data:`` URL of a referenced image (read and checked by :func:`read_image`)."""
    return data_url(reference, read_image(image_dir, reference, max_bytes), max_bytes)
