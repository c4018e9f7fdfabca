"""Fitting a dataset's oversized images (aml_evaluation.media.fit_image, rule fit-v1): real
images made with Pillow, fitted as the module docstring says, the same bytes every time."""

from __future__ import annotations

import hashlib
import io
import random

import pytest
from PIL import Image

from aml_evaluation import media
from aml_evaluation.media import ImageError, fit_image


def _noise(width: int, height: int, mode: str = "RGB", seed: int = 7) -> Image.Image:
    # Noise compresses badly: a small picture that is large in bytes, like a photo.
    channels = len(mode)
    data = random.Random(seed).randbytes(width * height * channels)
    return Image.frombytes(mode, (width, height), data)


def _encoded(image: Image.Image, format_name: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format=format_name, **options)
    return out.getvalue()


@pytest.fixture(scope="module")
def photo() -> bytes:
    """1,600 x 1,200 pixels of noise as PNG, ~5.8 MB: over the 5 MiB an Add image may take."""
    data = _encoded(_noise(1600, 1200), "PNG")
    assert len(data) > media.MAX_IMAGE_BYTES
    return data


def test_an_image_within_its_limit_is_sent_byte_for_byte() -> None:
    small = _encoded(_noise(40, 30), "PNG")
    assert fit_image("a.png", small) is small


@pytest.mark.parametrize("limit", [media.MAX_IMAGE_BYTES, media.MAX_QUERY_IMAGE_BYTES])
def test_an_oversized_image_is_fitted_to_what_a_vision_model_looks_at(
    photo: bytes, limit: int
) -> None:
    fitted = fit_image("D1_IMG_001.png", photo, limit)
    assert len(fitted) <= limit
    assert media.sniff_image_type(fitted) == media.JPEG
    with Image.open(io.BytesIO(fitted)) as image:
        # 1600 x 1200 -> short side 768 (long side under 2048): 1024 x 768, never enlarged.
        assert image.size == (1024, 768)
        assert image.format == "JPEG" and image.mode == "RGB"
        assert "progressive" not in image.info and "exif" not in image.info
    # The same source gives the same bytes: every retry and every run sends them.
    assert fit_image("again.png", photo, limit) == fitted


def test_the_quality_steps_down_until_the_image_fits(photo: bytes) -> None:
    at_add = fit_image("p.png", photo, media.MAX_IMAGE_BYTES)
    # Noise at 1024 x 768 is ~470 KB at the first quality (85): 300 KiB takes a lower one.
    tight = fit_image("p.png", photo, 300 * 1024)
    assert len(tight) <= 300 * 1024 < len(at_add)
    with Image.open(io.BytesIO(tight)) as image:
        assert image.size == (1024, 768)


def test_a_long_image_keeps_its_long_side_within_2048() -> None:
    strip = _encoded(_noise(4000, 1000), "JPEG", quality=95)
    with Image.open(io.BytesIO(fit_image("strip.jpg", strip, 1024 * 1024))) as image:
        # min(2048 / 4000, 768 / 1000) = 0.512
        assert image.size == (2048, 512)


def test_transparency_is_flattened_onto_white_and_exif_orientation_applied() -> None:
    clear = _noise(1200, 900, "RGBA")
    clear.putalpha(0)
    fitted = fit_image("clear.png", _encoded(clear, "PNG"), 64 * 1024)
    with Image.open(io.BytesIO(fitted)) as image:
        assert image.getpixel((10, 10)) == (255, 255, 255)
    # Orientation 6: stored sideways, shown turned 90 degrees clockwise.
    sideways = _noise(1500, 900)
    exif = Image.Exif()
    exif[0x0112] = 6
    source = _encoded(sideways, "JPEG", quality=95, exif=exif)
    assert len(source) > 1024 * 1024
    turned = fit_image("t.jpg", source, 1024 * 1024)
    with Image.open(io.BytesIO(turned)) as image:
        width, height = image.size
        assert height > width  # upright: 900 x 1500 -> 768 x 1280


def test_what_cannot_be_fitted_is_refused_naming_the_image(photo: bytes) -> None:
    with pytest.raises(ImageError, match=r"'tiny\.png' does not fit 2 KiB even fitted"):
        fit_image("tiny.png", photo, 2 * 1024)
    broken = b"\x89PNG\r\n\x1a\n" + bytes(600)
    with pytest.raises(ImageError, match=r"'broken\.png' does not decode"):
        fit_image("broken.png", broken, 100)
    # A small file announcing a huge picture (a decompression bomb) is refused before decoding.
    bomb = _encoded(Image.new("L", (12_000, 9_000)), "PNG")
    with pytest.raises(ImageError, match="over the 80,000,000 pixel limit"):
        fit_image("bomb.png", bomb, 1000)
    with pytest.raises(ImageError, match="over the 64 MiB per-image limit"):
        fit_image("huge.png", b"\x89PNG\r\n\x1a\n" + bytes(media.MAX_SOURCE_IMAGE_BYTES), 1000)


def test_the_fitted_bytes_are_pinned_by_the_rule() -> None:
    # Fitting is part of what a job's Adds are: if a Pillow upgrade changed these bytes, the
    # multimodal bundle's Adds would change under the same rule name. This catches it.
    source = _encoded(_noise(900, 900, seed=11), "PNG")
    fitted = fit_image("pin.png", source, 256 * 1024)
    assert hashlib.sha256(fitted).hexdigest() == PINNED_FIT_SHA256


PINNED_FIT_SHA256 = "239171f0815ab030d9c1944d975a92b176171651884030a0562219c421eba885"
