"""Files tinyverse writes (a video, an exported agent) appear whole or not at all."""

import contextlib
from pathlib import Path


@contextlib.contextmanager
def written_whole(path: Path):
    """A file beside ``path`` to write (its suffix kept: writers pick the format by it), moved onto
    ``path`` once written; removed if writing fails."""
    part = path.with_name(f".{path.stem}.part{path.suffix}")
    try:
        yield part
        part.replace(path)
    finally:
        part.unlink(missing_ok=True)
