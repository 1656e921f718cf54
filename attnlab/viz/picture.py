"""Pictures a notebook shows: what a drawing function wrote, kept as bytes with Jupyter's display hooks.

    plot_head_tables(tables, "heads.png", "detectors")   # returns a Picture: the cell shows it
    plot_run(run, "loss", "loss.png")                    # a Drawn: its summary line, and the picture
    Picture.of(lambda path: plot_lens(lens, path))       # draw to a temporary file, keep the bytes

A Picture reads the file once, right after it is written, so it shows even if the file is later
removed; a .json "picture" (the numbers) shows as nothing more than its path.
"""

from __future__ import annotations

import base64
import html
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

FORMATS = {".png": "png", ".svg": "svg"}  # the suffixes a notebook can show; anything else is only a file


class Picture:
    """The picture a drawing function wrote to `path` (PNG or SVG), shown inline by Jupyter."""

    def __init__(self, path: str | Path | None, data: bytes = b"", fmt: str | None = None):
        self.path = None if path is None else Path(path)
        self.format = fmt or (FORMATS.get(self.path.suffix.lower()) if self.path else None)
        self.data = data or (self.path.read_bytes() if self.format and self.path and self.path.is_file() else b"")

    @classmethod
    def of(cls, draw: Callable[[Path], Any], suffix: str = ".png") -> Picture:
        """Call draw(path) on a temporary file and keep what it wrote (for objects that draw themselves)."""
        with tempfile.TemporaryDirectory(prefix="attnlab-picture-") as folder:
            path = Path(folder) / f"picture{suffix}"
            draw(path)
            return cls(None, path.read_bytes(), FORMATS[suffix])

    def __repr__(self) -> str:
        where = f" {self.path}" if self.path else ""
        return f"<Picture{where} ({self.format or 'not shown'}, {len(self.data):,} bytes)>"

    def _repr_png_(self) -> bytes | None:
        return self.data if self.format == "png" and self.data else None

    def _repr_svg_(self) -> str | None:
        return self.data.decode("utf-8") if self.format == "svg" and self.data else None

    def html(self) -> str:
        """An <img> with the picture inline (data: URL), or "" when there is none to show."""
        if not self.data:
            return ""
        mime = "image/png" if self.format == "png" else "image/svg+xml"
        return f'<img class="attnlab-image" src="data:{mime};base64,{base64.b64encode(self.data).decode()}">'


class Drawn(str):
    """The one-line summary a drawing command prints (a str, so the CLI is unchanged), carrying the
    picture it drew: a notebook shows the picture with the summary under it."""

    picture: Picture
    inline: Callable[[], str] | None  # makes the HTML to show instead of a picture (an inline view), when shown

    def __new__(
        cls, summary: str, picture: Picture | str | Path | None, inline: Callable[[], str] | None = None
    ) -> Drawn:
        self = super().__new__(cls, summary)
        self.picture = picture if isinstance(picture, Picture) else Picture(picture)
        self.inline = inline
        return self

    def _repr_html_(self) -> str | None:
        if self.inline is not None:  # made only when a notebook shows it: the command line never pays
            return self.inline()
        img = self.picture.html()
        if not img:
            return None
        return f"<figure>{img}<figcaption>{html.escape(str(self))}</figcaption></figure>"
