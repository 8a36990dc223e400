"""Evaluation: held-out bits per byte on text (text.py) and greedy answers to instructions
(instructions.py), as `euler eval` reports them."""
