"""Inference: decoding with a KV cache, sampling, generation and chat sessions."""
