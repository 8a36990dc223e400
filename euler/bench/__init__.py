"""`euler bench`: our training step, layers and attention against the PyTorch peer."""
