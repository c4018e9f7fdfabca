"""Image references, types, limits and data URLs (aml_evaluation.media)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aml_evaluation import media
from aml_evaluation.media import ImageError

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 24
GIF = b"GIF89a" + b"\x00" * 24
WEBP = b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\x00" * 16


@pytest.mark.parametrize(
    ("data", "mime"),
    [(PNG, "image/png"), (JPEG, "image/jpeg"), (GIF, "image/gif"), (WEBP, "image/webp")],
)
def test_the_type_comes_from_the_magic_bytes(data: bytes, mime: str) -> None:
    assert media.sniff_image_type(data) == mime
    assert media.check_image("x.bin", data) == mime


@pytest.mark.parametrize("data", [b"BM" + b"\x00" * 30, b"<svg/>", b"RIFF\x00\x00\x00\x00WAVE"])
def test_other_types_are_refused(data: bytes) -> None:
    assert media.sniff_image_type(data) is None
    with pytest.raises(ImageError, match=r"'a.png' is not a PNG, JPEG, GIF or WebP"):
        media.check_image("a.png", data)


def test_empty_and_oversized_images_are_refused() -> None:
    with pytest.raises(ImageError, match=r"'e.png' is empty"):
        media.check_image("e.png", b"")
    big = PNG + b"\x00" * media.MAX_IMAGE_BYTES
    with pytest.raises(ImageError, match=r"'big.png' is \d+ bytes, over the 5 MiB"):
        media.check_image("big.png", big)


def test_data_url_round_trip() -> None:
    url = media.data_url("a.png", PNG)
    assert url.startswith("data:image/png;base64,")
    assert media.parse_data_url(url) == ("image/png", PNG)
    assert len(url) == media.data_url_length(len(PNG), "image/png")


def test_a_data_url_whose_type_lies_is_refused() -> None:
    url = media.data_url("a.png", PNG).replace("image/png", "image/gif")
    with pytest.raises(ImageError, match="declares image/gif, its bytes are image/png"):
        media.parse_data_url(url)
    with pytest.raises(ImageError, match="not a base64 image data URL"):
        media.parse_data_url("https://example.invalid/a.png")


@pytest.mark.parametrize(
    "reference",
    [
        "",
        "/etc/passwd",
        "../x.png",
        "a/../../x.png",
        "a//b.png",
        "./a.png",
        "a\\b.png",
        "a\x00.png",
    ],
)
def test_malformed_references_are_refused(reference: str) -> None:
    with pytest.raises(ImageError):
        media.check_reference(reference)


def test_reading_an_image_under_the_directory(tmp_path: Path) -> None:
    (tmp_path / "conv").mkdir()
    (tmp_path / "conv" / "D1_IMG_001.jpg").write_bytes(PNG)
    assert media.read_image(tmp_path, "conv/D1_IMG_001.jpg") == PNG
    assert media.image_file_size(tmp_path, "conv/D1_IMG_001.jpg") == len(PNG)
    url = media.image_data_url(tmp_path, "conv/D1_IMG_001.jpg")
    assert media.parse_data_url(url) == ("image/png", PNG)


def test_a_missing_image_names_the_reference_and_the_directory(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match=f"'conv/none.png' not found under {tmp_path}"):
        media.read_image(tmp_path, "conv/none.png")
    with pytest.raises(ImageError, match=r"image directory .* does not exist"):
        media.read_image(tmp_path / "nowhere", "a.png")


def test_a_symlink_escape_is_refused(tmp_path: Path) -> None:
    images, outside = tmp_path / "images", tmp_path / "secret.png"
    images.mkdir()
    outside.write_bytes(PNG)
    os.symlink(outside, images / "link.png")
    os.symlink(tmp_path, images / "up")
    with pytest.raises(ImageError, match="outside the image directory"):
        media.read_image(images, "link.png")
    with pytest.raises(ImageError, match="outside the image directory"):
        media.read_image(images, "up/secret.png")


def test_a_symlink_inside_the_directory_is_followed(tmp_path: Path) -> None:
    (tmp_path / "real.png").write_bytes(PNG)
    os.symlink(tmp_path / "real.png", tmp_path / "alias.png")
    assert media.read_image(tmp_path, "alias.png") == PNG


def test_a_directory_is_not_an_image(tmp_path: Path) -> None:
    (tmp_path / "d.png").mkdir()
    with pytest.raises(ImageError, match="not a regular file"):
        media.read_image(tmp_path, "d.png")


def test_an_oversized_file_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    (tmp_path / "big.png").write_bytes(PNG + b"\x00" * 100)
    with pytest.raises(ImageError, match=r"'big.png' .* larger than the 64 bytes per-image limit"):
        media.read_image(tmp_path, "big.png", max_bytes=64)


def test_budgets_name_the_place_and_the_limit() -> None:
    media.check_add_images([("a", 10)] * media.MAX_IMAGES_PER_ADD, "add 1")
    with pytest.raises(ImageError, match="add 1: 21 images, over the limit of 20"):
        media.check_add_images([("a", 10)] * 21, "add 1")
    with pytest.raises(ImageError, match=r"add 2: images add up to more than the 8 MiB .* 'b'"):
        media.check_add_images([("a", 5 * media.MIB), ("b", 4 * media.MIB)], "add 2")
    with pytest.raises(ImageError, match="message D1:1: 9 images, over the limit of 8"):
        media.check_message_images([("a", 1)] * 9, "message D1:1")
    with pytest.raises(ImageError, match="question q1: images add up to more than the 512 KiB"):
        media.check_query_images([("q", 600 * media.KIB)], "question q1")
    assert media.fits_in_add(19, 0, 1, 8 * media.MIB)
    assert not media.fits_in_add(20, 0, 1, 1)
    assert not media.fits_in_add(1, 8 * media.MIB, 1, 1)


def test_the_limits_fit_the_platform() -> None:
    # An Add's images as base64 stay well under MongoDB's 16 MiB document (the stored body);
    # a query image's under the 1 MiB NATS message that carries the Search body.
    assert media.data_url_length(media.MAX_ADD_IMAGE_BYTES) < 11 * media.MIB
    assert media.data_url_length(media.MAX_QUERY_IMAGE_BYTES) < 700 * media.KIB
    assert media.MAX_IMAGE_BYTES <= media.MAX_ADD_IMAGE_BYTES
