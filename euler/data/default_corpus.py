"""The embedded default corpus: English text every CPython install already has.

When `euler train` is given no data, it trains on the documentation that ships
inside the running Python: the `pydoc_data.topics` help pages (what `help("if")`
prints) and the docstrings of the pure-Python standard library modules, read
with `ast` (nothing is imported or executed). No network, no file of ours.
Prepared once (tokenizer trained on the same text) and cached in
<cache_root>/default-corpus/ (cache_root: $EULER_CACHE, $XDG_CACHE_HOME/nanoeuler
or ~/.cache/nanoeuler).
"""

from __future__ import annotations

import ast
import shutil
import sys
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

from euler.cache import cache_root
from euler.data.corpus import CorpusSource
from euler.data.manifest import MANIFEST_NAME, read_manifest
from euler.data.prepare import prepare_corpus
from euler.errors import EulerError

SKIP_DIRS = {"site-packages", "test", "tests", "idlelib", "lib2to3", "tkinter", "turtledemo"}
MIN_DOCSTRING = 80  # characters; shorter docstrings are mostly one-line labels


def pydoc_topics() -> Iterator[str]:
    """The `pydoc_data.topics` help pages, one document each (none if the build lacks them)."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return
    for name in sorted(topics):
        text = topics[name].strip()
        if text:
            yield text


def stdlib_docstrings() -> Iterator[str]:
    """Per standard-library module, its module/class/function docstrings joined as one document."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if SKIP_DIRS & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, OSError):
            continue
        docs = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= MIN_DOCSTRING:
                    docs.append(doc)
        if docs:
            yield "\n\n".join(docs)


def default_sources() -> list[CorpusSource]:
    """The two embedded sources: pydoc topics and stdlib docstrings (read once, kept in memory)."""
    where = f"CPython {sys.version.split()[0]} at {sysconfig.get_paths()['stdlib']}"
    topics, docstrings = list(pydoc_topics()), list(stdlib_docstrings())  # ~2 MB of text
    return [
        CorpusSource("pydoc-topics", lambda: iter(topics), [{"origin": f"pydoc_data of {where}"}]),
        CorpusSource(
            "stdlib-docstrings",
            lambda: iter(docstrings),
            [{"origin": f"standard library docstrings of {where}"}],
        ),
    ]


def default_corpus_dir(vocab_size: int = 512, log: Callable[[str], None] = print) -> Path:
    """A prepared shard folder of the embedded corpus for V = vocab_size, built on first use."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    out = cache_root() / "default-corpus" / f"cpython{version}-v{vocab_size}"
    if (out / MANIFEST_NAME).is_file():
        try:
            read_manifest(out, kind="pretrain")
            return out
        except EulerError:  # a corrupt cache (ours alone: under the cache root) is rebuilt
            shutil.rmtree(out)
    log(
        f"No training data given: using the embedded default corpus, the English "
        f"documentation inside CPython {version} itself (pydoc help topics and standard-library "
        f"docstrings), with a {vocab_size}-token tokenizer trained on it. Preparing it once "
        f"into {out} (set EULER_CACHE to move it); prepare real data with `euler data prepare`."
    )
    manifest = prepare_corpus(
        default_sources(), out, vocab_size=vocab_size, log=log, overwrite=True
    )
    if manifest["totals"]["tokens"]["train"] == 0:
        raise EulerError("the embedded default corpus is empty on this Python build")
    return out
