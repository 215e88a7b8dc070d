"""[image]'s generated PNGs (plan/images.py), read back by an independent decoder (Pillow), and the bodies
that carry them (plan/bodies.py): deterministic from the seed, distinct per request, OpenAI content parts."""
import base64
import io

import numpy as np
import orjson
import pytest
from PIL import Image

from loadgen.client.backends.openai import OpenAIBackend
from loadgen.plan import images
from loadgen.plan.bodies import Bodies
from loadgen.plan.prompts import ApproximateTokenizer, PromptMaker
from loadgen.plan.schedule import Schedule


def decode(data: bytes) -> np.ndarray:
    im = Image.open(io.BytesIO(data))
    im.load()
    assert im.mode == "RGB"
    return np.asarray(im)


@pytest.mark.parametrize("w, h", [(1, 1), (7, 5), (448, 448), (1000, 3)])
def test_noise_png_decodes_to_the_drawn_pixels(w, h):
    data = images.png(w, h, np.random.default_rng(4))
    expect = np.random.default_rng(4).integers(0, 256, (h, w, 3), dtype=np.uint8)
    assert (decode(data) == expect).all()
    assert images.png_size(images.data_url(data)) == (w, h)
    assert len(data) >= 3 * w * h          # noise does not compress: a photo's wire size


def test_flat_png_is_one_colour_and_small():
    data = images.png(512, 256, np.random.default_rng(1), "flat")
    px = decode(data)
    assert px.shape == (256, 512, 3) and (px == px[0, 0]).all() and len(data) < 8_000


def test_bodies_carry_each_rows_images_after_its_text():
    s = Schedule(np.arange(3, dtype=np.int64), np.full(3, 20), np.full(3, 4), np.zeros(3, bool), 1,
                 images=np.array([2, 0, 1]), image_width=np.array([30, -1, 30]), image_height=np.array([10, -1, 10]))
    make = lambda: Bodies(s, OpenAIBackend("chat", "m", {}), PromptMaker(ApproximateTokenizer()), 1, salt=5,  # noqa: E731
                          image_fill="noise").build_all()
    bodies = [orjson.loads(b) for b in make()]
    assert make() == [orjson.dumps(b) for b in bodies]            # the same plan sends the same bytes
    content = [b["messages"][-1]["content"] for b in bodies]
    assert isinstance(content[1], str)                            # no images: plain text
    parts = content[0]
    assert parts[0]["type"] == "text" and [p["type"] for p in parts[1:]] == ["image_url", "image_url"]
    urls = [p["image_url"]["url"] for c in (content[0], content[2]) for p in c[1:]]
    assert len(set(urls)) == 3                                    # no image repeats within the run
    for u in urls:
        assert decode(base64.b64decode(u.split(",", 1)[1])).shape == (10, 30, 3)
