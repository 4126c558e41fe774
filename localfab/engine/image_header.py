"""An image's format and size from its first bytes, before anything decodes it (no
llama.cpp here: the chat layer reads it too, for the images it stores)."""

from __future__ import annotations

import struct

from localfab.errors import LocalfabError

# Larger images are refused before they are decoded (a small file can claim a huge size).
MAX_PIXELS = 1 << 26  # 8192 x 8192
FORMATS = "PNG, JPEG, GIF or BMP"


def image_size(data: bytes) -> tuple[str, int, int]:
    """The format, width and height an image's header says; LocalfabError for what is not an
    image llama.cpp reads, a header cut short, or more than `MAX_PIXELS`."""
    fmt, size = _header(data)
    if size is None:
        raise LocalfabError(f"the {fmt} image is corrupt or cut short (its header is incomplete)")
    width, height = size
    if width <= 0 or height <= 0:
        raise LocalfabError(f"the {fmt} image says it is {width}x{height} pixels: corrupt")
    if width * height > MAX_PIXELS:
        raise LocalfabError(
            f"the {fmt} image is {width}x{height} pixels, more than {MAX_PIXELS // 10**6} million: "
            "scale it down first"
        )
    return fmt, width, height


def _header(data: bytes) -> tuple[str, tuple[int, int] | None]:
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        if len(data) < 24 or data[12:16] != b"IHDR":
            return "PNG", None
        return "PNG", struct.unpack(">II", data[16:24])
    if data.startswith(b"\xff\xd8"):
        return "JPEG", _jpeg_size(data)
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF", struct.unpack("<HH", data[6:10]) if len(data) >= 10 else None
    if data.startswith(b"BM"):
        if len(data) < 26:
            return "BMP", None
        width, height = struct.unpack("<ii", data[18:26])
        return "BMP", (width, abs(height))
    raise LocalfabError(f"not an image llama.cpp can read: give a {FORMATS} file")


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """A JPEG's size from its frame header (SOF0..SOF15 but DHT, JPG and DAC)."""
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        length = struct.unpack(">H", data[i + 2 : i + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 9 > len(data):
                return None
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return width, height
        i += 2 + length
    return None
