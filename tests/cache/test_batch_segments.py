"""cache.batches.segments: where a batch's pipelines end, by order and by the bytes of the documents patched."""

from cache.batches.operations import GET, PATCH, PUT, Operation, OperationResult
from cache.batches.segments import GROWTH, PatchReads, segment_bytes, segments

MIB = 1024 * 1024


def patch(doc_id: str, max_size: int = MIB) -> OperationResult:
    return OperationResult(Operation(PATCH, b"c", doc_id.encode(), patch={"n": 1}, max_size=max_size))


def test_a_patch_of_a_document_written_earlier_in_the_run_starts_a_new_one():
    operations = [Operation(PUT, b"c", b"a", body=b"{}"), Operation(PATCH, b"c", b"b"), Operation(PATCH, b"c", b"a")]
    operations.append(Operation(GET, b"c", b"a"))
    assert segments(operations) == [(0, 2), (2, 4)]


def test_any_number_of_patches_of_distinct_documents_is_one_run():
    assert segments([Operation(PATCH, b"c", b"%d" % n) for n in range(1000)]) == [(0, 1000)]


def test_unknown_sizes_share_the_segment_and_the_first_patch_may_read_a_whole_document():
    """100 patches, 4 MiB: the first reads up to JETWAY_MAX_BODY, the 99 others share the 3 MiB left (31 KiB)."""
    reads = PatchReads(4 * MIB)
    caps = reads.caps([patch(f"d{n}") for n in range(100)])
    assert caps[0] == MIB and set(caps[1:]) == {3 * MIB // 99} and len(caps) == 100
    assert sum(caps) <= 4 * MIB


def test_small_documents_all_fit_one_segment():
    reads = PatchReads(4 * MIB)
    patches = [patch(f"d{n}") for n in range(1000)]
    for result in patches:
        assert reads.learn(result, [b"x" * 200, b'"e"', b"m"])
    assert len(reads.caps(patches)) == 1000


def test_known_large_documents_go_a_few_to_a_segment():
    """Sizes answered instead of bodies are kept: 1 MiB documents are read 3 (+ room) to a 4 MiB segment."""
    reads = PatchReads(4 * MIB)
    patches = [patch(f"d{n}") for n in range(10)]
    for result in patches[1:]:
        assert not reads.learn(result, MIB - 9)
    caps = reads.caps(patches)
    assert caps == [MIB, MIB - 9 + GROWTH, MIB - 9 + GROWTH]


def test_a_first_patch_that_keeps_missing_its_cap_gives_up():
    reads = PatchReads(4 * MIB)
    result = patch("d")
    assert [reads.first_missed(result) for _ in range(4)] == [False, False, False, True]


def test_the_segment_is_never_larger_than_the_answer_budget():
    assert segment_bytes(16 * MIB) == 4 * MIB and segment_bytes(16384) == 16384
