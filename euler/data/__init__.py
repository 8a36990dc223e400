"""Data pipeline: real books, web text and instructions in; token shards and batches out.

Modules: sources (books/web inputs and readers), gutenberg (header/footer
stripping), download (HTTP cache with resume), shards (binary format), manifest,
corpus + prepare (pretraining shards), loader (TokenLoader), chat_template and sft
(SFT records and masks), default_corpus (the embedded CPython documentation corpus).
"""

from euler.data.chat_template import encode_prompt
from euler.data.corpus import file_source
from euler.data.default_corpus import default_corpus_dir
from euler.data.loader import TokenLoader
from euler.data.prepare import prepare_corpus
from euler.data.sft import SFTDataset, prepare_sft

__all__ = [
    "SFTDataset",
    "TokenLoader",
    "default_corpus_dir",
    "encode_prompt",
    "file_source",
    "prepare_corpus",
    "prepare_sft",
]
