"""euler.gpu.schedule's list scheduling of the dkv grid."""

from euler.gpu.schedule import dkv_blocks, makespan


def test_makespan_gives_each_job_the_slot_that_frees_first() -> None:
    assert makespan([3, 2, 2, 1], 2) == 4  # 3 | 2, then 2 after the 2 (4), 1 after the 3 (4)
    assert makespan([3, 2, 2, 1], 2, first=(5,)) == 7  # 5 | 3, 2 (5), then 2 (7) | 1 (6)
    assert makespan([1.0] * 10, 5) == 2


def test_blocks_of_the_dkv_grid() -> None:
    """T = 256 (4 key tiles), 3 query heads a kv head, one pair: tile j runs 3 (4 - j)
    iterations, plus the overhead; split at 6, the blocks over it are cut in two."""
    assert dkv_blocks(256, 1, 3, 1, 0.5) == [12.5, 9.5, 6.5, 3.5]
    assert dkv_blocks(256, 1, 3, 1, 0, 6) == [6, 6, 6, 5, 4, 3]
    assert dkv_blocks(128, 2, 2, 2, 0) == [2, 2, 2, 2, 1, 1, 1, 1]  # B G pairs a tile
