"""Training: the loop, AdamW, CUDA-graph steps, data parallelism, run folders, checkpoints."""
