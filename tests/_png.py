"""What a chart test checks of a PNG a chart function wrote: a real, non-blank image of a readable size."""

from __future__ import annotations

from pathlib import Path

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path: str) -> None:
    from PIL import Image

    data = Path(path).read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > 5_000, path
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] >= 400 and im.size[1] >= 300
        lo_hi = im.convert("L").getextrema()
        assert lo_hi[1] - lo_hi[0] > 100, f"{path} looks blank"  # something was drawn on the white canvas
