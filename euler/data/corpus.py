"""A named corpus source: a weight, the inputs it came from, and its documents.

`prepare_corpus` sees only this, so file-based sources (books, web) and the embedded
default (CPython's own documentation) go through the same tokenizing code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from euler.data.gutenberg import DEFAULT_MIRROR
from euler.data.sources import InputFile, iter_documents, resolve_inputs


@dataclass
class CorpusSource:
    """One named source. `documents()` must yield the same documents every time it is called."""

    name: str
    documents: Callable[[], Iterator[str]]
    inputs: list[dict] = field(default_factory=list)  # manifest entries (origin, bytes, sha256)
    weight: float | None = None  # sampling weight in the loader; None: by tokens


def file_source(
    kind: str,
    items: list[str],
    weight: float | None = None,
    text_column: str = "text",
    progress: bool = True,
    mirror: str = DEFAULT_MIRROR,
) -> CorpusSource:
    """A books or web source from paths, folders, URLs and (books) ebook numbers."""
    files = resolve_inputs(kind, items, mirror=mirror, progress=progress)

    def documents(files: list[InputFile] = files) -> Iterator[str]:
        for f in files:
            yield from iter_documents(f, text_column)

    return CorpusSource(kind, documents, [f.describe() for f in files], weight)
