"""cache.memory_return: a pass of collector steps then malloc_trim after a large answer; give_back trims now."""

from twisted.internet import task

from cache import memory_return
from cache.memory_return import STEP_BATCH, MemoryReturn, give_back


def test_a_large_answer_is_followed_by_one_pass_a_second_later():
    clock = task.Clock()
    memory = MemoryReturn(clock, large=1000, delay=1.0)
    memory.after_answer(999)
    assert not clock.getDelayedCalls()
    memory.after_answer(1000)
    memory.after_answer(5000)  # shares the pass already due
    assert len(clock.getDelayedCalls()) == 1
    clock.advance(1.0)
    for _ in range(300):  # one collector step a turn (PyPy), until a major collection ends
        if memory.passes:
            break
        clock.advance(0)
    assert memory.passes == 1 and not clock.getDelayedCalls()
    memory.after_answer(5000)  # a later answer gets a pass of its own
    assert len(clock.getDelayedCalls()) == 1


def test_a_large_batch_is_followed_by_one_collector_step_in_the_next_turn():
    clock = task.Clock()
    memory = MemoryReturn(clock, large=10 * STEP_BATCH)
    memory.after_batch(STEP_BATCH - 1, 100)
    assert not clock.getDelayedCalls()
    memory.after_batch(STEP_BATCH, 100)
    memory.after_batch(STEP_BATCH * 2, 100)  # shares the step already due
    assert [call.getTime() for call in clock.getDelayedCalls()] == [0]
    clock.advance(0)
    assert memory.steps == 1 and memory.passes == 0 and not clock.getDelayedCalls()
    memory.after_batch(STEP_BATCH, 10 * STEP_BATCH)  # an answer this large also gets its pass a second later
    assert sorted(call.getTime() for call in clock.getDelayedCalls()) == [0, 1.0]


def test_give_back_asks_glibc_for_every_free_page_and_does_nothing_without_it(monkeypatch):
    pads = []
    monkeypatch.setattr(memory_return, "_malloc_trim", lambda: pads.append)
    give_back()
    assert pads == [0]
    monkeypatch.setattr(memory_return, "_malloc_trim", lambda: None)
    give_back()  # musl, macOS: no malloc_trim, no error
