"""How prange loops that reduce are cut into chunks.

A fixed count (not the thread count) keeps every reduction's summation order, and so every
result bit, the same on any machine and any number of threads: a resumed run then
reproduces the uninterrupted one exactly.
"""

CHUNKS = 16
