"""traces/arrow_kernels.py gives what Arrow's methods and pyarrow.compute's
wrappers give (their default options), on arrays with nulls, repeats,
empty strings and non-ASCII text."""

import pyarrow as pa
import pyarrow.compute as pc

from traces import arrow_kernels as ak

NAMES = pa.array(["a", None, "b", "a", "", "é", None, "b"], pa.string())
INTS = pa.array([3, None, 1, 3, 0, 7], pa.int64())


def test_the_kernels_give_what_arrows_methods_give():
    rows = pa.array([7, 0, 2, 2], pa.int64())
    mask = pa.array([True, False, None, True, True, False, True, True])
    assert ak.take(NAMES, rows).equals(NAMES.take(rows))
    assert ak.filter(NAMES, mask).equals(NAMES.filter(mask))
    assert ak.unique(NAMES).equals(NAMES.unique())
    assert ak.is_null(NAMES).equals(NAMES.is_null())
    assert ak.is_valid(NAMES).equals(NAMES.is_valid())
    assert ak.fill_null(INTS, -1).equals(INTS.fill_null(-1))
    for array in (NAMES, INTS):
        assert ak.dictionary_encode(array).equals(array.dictionary_encode())
        encoded = ak.dictionary_encode(array, null_encoding="encode")
        assert encoded.equals(array.dictionary_encode(null_encoding="encode"))


def test_the_kernels_give_what_pyarrow_compute_gives():
    known = pa.array(["b", "é"], pa.string())
    assert ak.index_in(NAMES, known).equals(pc.index_in(NAMES, value_set=known))
    left = pa.array([True, False, None, True])
    right = pa.array([True, True, True, None])
    assert ak.and_(left, right).equals(pc.and_(left, right))
    for values in ([None, None], [], [False, None], [False, True]):
        array = pa.array(values, pa.bool_())
        assert ak.any_true(array) is bool(pc.any(array).as_py())
