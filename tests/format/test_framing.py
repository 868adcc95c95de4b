import pytest

from ninfer_format.errors import FramingError, PartFileError, WriteError
from ninfer_format.framing import (
    ENTRY_MAGIC,
    PART_MAGIC,
    align_up,
    check_part_header,
    pack_part_header,
    parse_entry_header,
    part_file_name,
    shard_sizes,
)


def test_shard_sizes_default_limit_numbers_from_spec():
    sizes = shard_sizes(65536, 31_999_934_464 + 4096, 32_000_000_000)
    assert sizes == [31_999_934_464, 4096]
    assert 65536 + sizes[0] == 32_000_000_000
    assert 4096 + sizes[1] == 8192


def test_shard_sizes_upstream_sharded_example():
    assert shard_sizes(65536, 140_246_016, 64_000_000) == [63_934_464, 63_995_904, 12_315_648]


def test_shard_sizes_single_file_and_unlimited():
    assert shard_sizes(4096, 10, 32_000_000_000) == [10]
    assert shard_sizes(4096, 10**12, 0) == [10**12]


def test_shard_limit_too_small_is_a_clear_error():
    with pytest.raises(WriteError, match="too small"):
        shard_sizes(65536, 10**6, 65536)


def test_part_names_pad_to_four_digits():
    assert part_file_name("m.ninfer", 1) == "m.ninfer.part-0001"
    assert part_file_name("m.ninfer", 12345) == "m.ninfer.part-12345"


def test_entry_header_rules():
    head = ENTRY_MAGIC + (100).to_bytes(8, "little") + bytes(16)
    h = parse_entry_header(head, 4096, "m")
    assert (h.json_bytes, h.metadata_end, h.payload_start) == (100, 132, 4096)
    assert align_up(4096, 4096) == 4096 and align_up(4097, 4096) == 8192
    with pytest.raises(FramingError, match="v2"):
        parse_entry_header(b"NINFER\x00\x02" + bytes(24), 4096, "m")
    with pytest.raises(FramingError, match="continuation"):
        parse_entry_header(PART_MAGIC + bytes(24), 4096, "m")
    with pytest.raises(FramingError, match=r"not a \.ninfer v3"):
        parse_entry_header(b"GGUF" + bytes(28), 4096, "m")
    with pytest.raises(FramingError, match="json_bytes=0"):
        parse_entry_header(ENTRY_MAGIC + bytes(24), 4096, "m")
    with pytest.raises(FramingError, match="json_bytes=5000"):
        parse_entry_header(ENTRY_MAGIC + (5000).to_bytes(8, "little") + bytes(16), 4096, "m")
    with pytest.raises(FramingError, match=r"shorter"):
        parse_entry_header(ENTRY_MAGIC, 8, "m")


def test_part_header_rules():
    aid = bytes(range(16))
    head = pack_part_header(2, aid)
    check_part_header(head, 4096 + 10, "p", 2, aid, 10)
    with pytest.raises(PartFileError, match="part_index is 2, expected 1"):
        check_part_header(head, 4106, "p", 1, aid, 10)
    with pytest.raises(PartFileError, match="another artifact"):
        check_part_header(head, 4106, "p", 2, bytes(16), 10)
    with pytest.raises(PartFileError, match="expected 4106"):
        check_part_header(head, 4105, "p", 2, aid, 10)
    with pytest.raises(PartFileError, match="magic"):
        check_part_header(ENTRY_MAGIC + bytes(24), 4106, "p", 2, aid, 10)
