"""Bit-packing of codewords: exact round trips for every width, the MSB-first layout, rejects."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from shared.wire.bitpack import MAX_BITS, bits_for, pack_codes, packed_nbytes, unpack_codes


def reference_pack(codes: list[int], bits: int) -> bytes:
    """Oracle: the layout written out as a '0'/'1' string, MSB first, zero-padded."""
    stream = "".join(format(code, f"0{bits}b") for code in codes) if bits else ""
    stream += "0" * (-len(stream) % 8)
    return bytes(int(stream[i : i + 8], 2) for i in range(0, len(stream), 8))


@st.composite
def codes_and_bits(draw: st.DrawFn, max_count: int = 300) -> tuple[np.ndarray, int]:
    bits = draw(st.integers(0, MAX_BITS))
    count = draw(st.integers(0, max_count))
    codes = draw(
        hnp.arrays(np.int64, count, elements=st.integers(0, (1 << bits) - 1)),
    )
    return codes, bits


# ------------------------------------------------------------------------------------------
# layout
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("codes", "bits", "expected"),
    [
        ([5, 3, 7], 3, b"\xaf\x80"),  # 101 011 111 + 0000000
        ([1, 0, 1, 1, 0, 0, 0, 0, 1], 1, b"\xb0\x80"),  # 10110000 1 + 0000000
        ([3, 0, 1], 2, b"\xc4"),  # 11 00 01 + 00
        ([0xA, 0x5, 0xF], 4, b"\xa5\xf0"),  # 1010 0101 1111 + 0000
        ([1, 1023], 10, b"\x00\x7f\xf0"),  # 0000000001 1111111111 + 0000
        ([0x1234, 0xFFFF], 16, b"\x12\x34\xff\xff"),  # big-endian, no padding
        ([0xAB], 8, b"\xab"),
        ([0, 0, 0], 0, b""),  # L == 1: nothing to send
    ],
)
def test_pack_layout_is_msb_first_and_zero_padded(codes: list[int], bits: int, expected: bytes):
    # Act
    packed = pack_codes(np.array(codes, dtype=np.int64), bits)

    # Assert
    assert packed == expected
    assert unpack_codes(packed, len(codes), bits).tolist() == codes


def test_pack_reads_multidimensional_codes_in_row_major_order():
    # Prepare
    codes = np.array([[1, 2], [3, 0]], dtype=np.int32)

    # Act / Assert
    assert pack_codes(codes, 2) == bytes([0b01101100])
    assert pack_codes(np.asfortranarray(codes), 2) == bytes([0b01101100])


@pytest.mark.parametrize(
    ("L", "bits"),
    [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (255, 8), (256, 8), (257, 9), (65_536, 16)],
)
def test_bits_for_is_ceil_log2(L: int, bits: int):
    assert bits_for(L) == bits


@pytest.mark.parametrize("L", [0, -1, 65_537, True, 2.0])
def test_bits_for_rejects_out_of_range(L: object):
    with pytest.raises(ValueError, match="L must be an int"):
        bits_for(L)  # type: ignore[arg-type]


def test_packed_nbytes_rounds_up_to_whole_bytes():
    assert [packed_nbytes(n, 3) for n in range(5)] == [0, 1, 1, 2, 2]
    assert packed_nbytes(20 * 1152, 1) == 2880


# ------------------------------------------------------------------------------------------
# round trips
# ------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(codes_and_bits())
def test_round_trip_is_exact_and_matches_the_oracle(case: tuple[np.ndarray, int]):
    # Prepare
    codes, bits = case

    # Act
    packed = pack_codes(codes, bits)
    unpacked = unpack_codes(packed, codes.size, bits)

    # Assert
    assert packed == reference_pack(codes.tolist(), bits)
    assert len(packed) == packed_nbytes(codes.size, bits)
    assert unpacked.dtype == np.uint16
    assert unpacked.flags.writeable
    np.testing.assert_array_equal(unpacked, codes)


@pytest.mark.parametrize("bits", range(MAX_BITS + 1))
def test_round_trip_at_femnist_size_for_every_width(bits: int):
    # Prepare: 20 x 1152 codes, the paper's FEMNIST batch, with both extreme codes present
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, size=(20, 1152))
    codes.flat[0], codes.flat[-1] = 0, (1 << bits) - 1

    # Act
    unpacked = unpack_codes(pack_codes(codes, bits), codes.size, bits)

    # Assert
    np.testing.assert_array_equal(unpacked.reshape(codes.shape), codes)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.uint16, np.int32, np.uint64])
def test_pack_accepts_any_integer_dtype(dtype: type):
    codes = np.array([1, 2, 3], dtype=dtype)
    assert pack_codes(codes, 2) == pack_codes(codes.astype(np.int64), 2)


# ------------------------------------------------------------------------------------------
# rejects
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("codes", "bits", "fragment"),
    [
        (np.array([4]), 2, "must lie in"),
        (np.array([-1]), 3, "must lie in"),
        (np.array([1]), 0, "must lie in"),
        (np.array([1.0]), 2, "integer array"),
        (np.array([True]), 1, "integer array"),
        (np.array([1]), 17, "bits must be"),
        (np.array([1]), -1, "bits must be"),
    ],
)
def test_pack_rejects_bad_codes_or_widths(codes: np.ndarray, bits: int, fragment: str):
    with pytest.raises(ValueError, match=fragment):
        pack_codes(codes, bits)


@settings(max_examples=100, deadline=None)
@given(codes_and_bits(max_count=40), st.sampled_from([-2, -1, 1, 2]))
def test_unpack_rejects_wrong_lengths(case: tuple[np.ndarray, int], delta: int):
    # Prepare
    codes, bits = case
    packed = pack_codes(codes, bits)
    wrong = packed + b"\x00" * delta if delta > 0 else packed[:delta]

    # Act / Assert
    if len(wrong) != len(packed):  # slicing an empty payload cannot shorten it
        with pytest.raises(ValueError, match="expected .* bytes"):
            unpack_codes(wrong, codes.size, bits)


@settings(max_examples=100, deadline=None)
@given(codes_and_bits(max_count=40), st.data())
def test_unpack_rejects_any_non_zero_padding_bit(case: tuple[np.ndarray, int], data: st.DataObject):
    # Prepare
    codes, bits = case
    packed = pack_codes(codes, bits)
    pad = len(packed) * 8 - codes.size * bits
    if pad == 0:
        return
    bit = data.draw(st.integers(0, pad - 1))
    tampered = packed[:-1] + bytes([packed[-1] | (1 << bit)])

    # Act / Assert
    with pytest.raises(ValueError, match="padding bits"):
        unpack_codes(tampered, codes.size, bits)


def test_unpack_of_zero_bits_needs_an_empty_payload():
    np.testing.assert_array_equal(unpack_codes(b"", 5, 0), np.zeros(5))
    with pytest.raises(ValueError, match="expected 0 bytes"):
        unpack_codes(b"\x00", 5, 0)
