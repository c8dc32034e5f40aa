"""cache.memory_return: a large answer is followed by one pass of collector steps, then malloc_trim."""

from twisted.internet import task

from cache.memory_return import MemoryReturn


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
