"""`kbert.models.process_inference.row_share`: how inference over several processes shares
the rows (tests/test_multiprocess.py runs the calls over two real processes)."""

import numpy as np
import pytest

from kbert.models import process_inference


def _dealt(lengths, count):
    """The row-sharing rule written out: rows by length, longest first (ties in row order),
    dealt to the processes in turn. Returns each process' sorted row indices."""
    order = sorted(range(len(lengths)), key=lambda row: (-lengths[row], row))
    shares = [[] for _ in range(count)]
    for position, row in enumerate(order):
        shares[position % count].append(row)
    return [sorted(share) for share in shares]


@pytest.mark.backend_independent
@pytest.mark.parametrize("count", [1, 2, 3])
def test_row_share_deals_rows_longest_first_in_turn(count):
    rng = np.random.default_rng(count)
    lengths = rng.integers(1, 9, 29)  # many ties
    shares = [process_inference.row_share(lengths, index=i, count=count) for i in range(count)]
    for got, expected in zip(shares, _dealt(lengths.tolist(), count), strict=True):
        np.testing.assert_array_equal(got, expected)
    # Every row once: sizes differ by at most one, and so does the longest row of each share.
    np.testing.assert_array_equal(np.sort(np.concatenate(shares)), np.arange(29))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    if count > 1:
        # Longest first: process 0 gets the longest row, every process gets long and short.
        assert lengths.argmax() in shares[0]
        tops = sorted(lengths, reverse=True)
        for index, share in enumerate(shares):
            assert sorted(lengths[share], reverse=True) == tops[index::count]
    # Raw texts are shared by their characters.
    words = ["a" * n for n in lengths]
    np.testing.assert_array_equal(
        process_inference.row_share([len(w) for w in words], index=0, count=count), shares[0]
    )
