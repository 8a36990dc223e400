"""Data pipeline: real books, web text and instructions in; token shards and batches out.

Modules: sources (books/web inputs and readers), gutenberg (header/footer
stripping), download (HTTP cache with resume), shards (binary format), manifest,
prepare (pretraining shards), loader (TokenLoader), chat_template and sft (SFT
records and masks), default_corpus (the embedded CPython documentation corpus).
"""

from euler.data.default_corpus import default_corpus_dir
from euler.data.loader import TokenLoader
from euler.data.sft import SFTDataset

__all__ = ["TokenLoader", "SFTDataset", "default_corpus_dir"]
