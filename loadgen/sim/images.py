"""The simulator's reading of chat images (OpenAI `image_url` parts holding PNG data URLs), as a vision
model's server would: each image becomes prompt tokens the engine prefills like text.

The stated rule: an image of w x h pixels costs ceil(w / PATCH_PX) * ceil(h / PATCH_PX) tokens (a 14-pixel
ViT patch grid merged 2 x 2, as Qwen2-VL counts them; a 448 x 448 image is 256 tokens). The tokens are
placeholders unique to the image's bytes (a hash), so the prefix cache hits only on a repeated image, as
vLLM's multimodal hashing does. Only PNG data URLs are read (what loadgen sends): the width and height come
from the file's IHDR; anything else is a 400.
"""
from __future__ import annotations

import base64
import hashlib
import math
import struct
from typing import Any

PATCH_PX = 28


def tokens_of(width: int, height: int) -> int:
    return math.ceil(width / PATCH_PX) * math.ceil(height / PATCH_PX)


def _size(url: str) -> tuple[int, int]:
    head = "data:image/png;base64,"
    if not url.startswith(head):
        raise ValueError("an image_url must be a data:image/png;base64 URL here")
    try:
        b = base64.b64decode(url[len(head):len(head) + 44])
    except ValueError:
        raise ValueError("an image_url's base64 data does not decode") from None
    if len(b) < 24 or not b.startswith(b"\x89PNG\r\n\x1a\n") or b[12:16] != b"IHDR":
        raise ValueError("an image_url's data is not a PNG file")
    w, h = struct.unpack(">II", b[16:24])
    if not (w and h):
        raise ValueError("an image of zero pixels")
    return w, h


def image_tokens(messages: Any) -> list[str]:
    """The placeholder tokens of every image part in the messages, in order. Raises ValueError."""
    out: list[str] = []
    for m in messages if isinstance(messages, list) else ():
        content = m.get("content") if isinstance(m, dict) else None
        for p in content if isinstance(content, list) else ():
            if not isinstance(p, dict) or p.get("type") != "image_url":
                continue
            url = (p.get("image_url") or {}).get("url") if isinstance(p.get("image_url"), dict) else None
            if not isinstance(url, str):
                raise ValueError("an image_url part needs image_url.url")
            w, h = _size(url)
            tag = hashlib.blake2b(url.encode("ascii", "replace"), digest_size=6).hexdigest()
            out += [f"<img{tag}_{k}>" for k in range(tokens_of(w, h))]
    return out
