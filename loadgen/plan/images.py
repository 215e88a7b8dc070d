"""The images of `[image]` requests: PNG files generated from the seed, sent as base64 data URLs in chat
message parts (OpenAI's `{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`).

Contract:
- each image is a function of (seed, salt, request, its index): the same plan sends the same bytes, two
  images of a run never repeat (a server's multimodal cache, keyed by the image's content, gets no hit
  from another request or another run with another salt);
- fill "noise": every pixel drawn at random (8-bit RGB), so the PNG does not compress: the wire size of a
  photo of that resolution (about 3 bytes per pixel, 4 as base64); "flat": one random colour, a PNG of a
  few hundred bytes: the server decodes the same pixels, the network carries almost nothing;
- written with zlib alone (no imaging library): the IHDR says width x height, 8-bit RGB, no interlace.
"""
from __future__ import annotations

import base64
import struct
import zlib

import numpy as np

from loadgen.config.runconfig import IMAGE_FILLS as FILLS  # noqa: F401  (the fills, owned by the config)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png(width: int, height: int, rng: np.random.Generator, fill: str = "noise") -> bytes:
    """A width x height 8-bit RGB PNG of `fill` pixels drawn from rng."""
    if fill == "flat":
        pixels = np.broadcast_to(rng.integers(0, 256, 3, dtype=np.uint8), (height, width, 3))
    else:
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    raw = np.zeros((height, 1 + 3 * width), dtype=np.uint8)   # each scanline: filter type 0, then RGB
    raw[:, 1:] = pixels.reshape(height, 3 * width)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(raw.tobytes(), 1))
            + _chunk(b"IEND", b""))


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode("ascii")


def png_size(url: str) -> tuple[int, int] | None:
    """(width, height) from a PNG data URL's IHDR (reads its first bytes only); None when it is not one."""
    head = "data:image/png;base64,"
    if not url.startswith(head):
        return None
    try:
        b = base64.b64decode(url[len(head):len(head) + 44])   # 33 bytes: signature + IHDR
    except ValueError:
        return None
    if len(b) < 24 or not b.startswith(b"\x89PNG\r\n\x1a\n") or b[12:16] != b"IHDR":
        return None
    w, h = struct.unpack(">II", b[16:24])
    return w, h


def parts(n: int, width: int, height: int, rng: np.random.Generator, fill: str) -> list[dict]:
    """n chat content parts, one image each."""
    return [{"type": "image_url", "image_url": {"url": data_url(png(width, height, rng, fill))}} for _ in range(n)]
