"""euler.gpu.schedule: list scheduling of the dkv grid and attention_tc.ROW_ORDER's order."""

from pytest import approx

from euler.gpu.schedule import dkv_rows, makespan, row_order


def test_makespan_gives_each_job_the_slot_that_frees_first() -> None:
    assert makespan([3, 2, 2, 1], 2) == 4  # 3 | 2, then 2 after the 2 (4), 1 after the 3 (4)
    assert makespan([3, 2, 2, 1], 2, first=(5,)) == 7  # 5 | 3, 2 (5), then 2 (7) | 1 (6)
    assert makespan([1.0] * 10, 5) == 2


def test_dkv_rows_hold_each_key_tiles_blocks_in_the_rows_order() -> None:
    # T = 256 (4 key tiles), 3 query heads a kv head, 2 pairs: tile j runs 3 (4 - j) iterations
    assert dkv_rows([0, 2, 1, 3], 4, 3, 2, 0.5) == [12.5] * 2 + [6.5] * 2 + [9.5] * 2 + [3.5] * 2


def test_row_order_at_the_gpu_preset() -> None:
    """B=32, H=12, G=4, T=512 on an H200's 264 slots after the 64 prep blocks of 48 units:
    the order found when ROW_ORDER was written, 58.5 and 60.0 iterations against 59 and 61
    heaviest first; heaviest first where nothing beats it (B = 8: one wave) and past 8
    tiles."""
    order = row_order(8, 3, 128, 264, 64, 48)
    assert order == (0, 1, 6, 2, 4, 3, 5, 7)
    first = (0.19 * 48,) * 64
    for ov, want, heaviest_first in ((0.5, 58.5, 59), (1.0, 60.0, 61)):
        assert makespan(dkv_rows(list(order), 8, 3, 128, ov), 264, first) == approx(want)
        got = makespan(dkv_rows(list(range(8)), 8, 3, 128, ov), 264, first)
        assert got == approx(heaviest_first)
    assert row_order(8, 3, 32, 264, 16, 48) == tuple(range(8))
    assert row_order(16, 3, 128, 264, 64, 96) == tuple(range(16))
    assert row_order(2, 3, 128, 264, 64, 12) == (0, 1)
