"""Interop: Hugging Face Llama folders out (export) and in (import)."""
