"""cache.turns: items done in order, in slices of bounded time, the reactor served between slices."""

from twisted.internet import task

from cache.turns import in_turns


class Ticks:
    """A timer that moves on by ``step`` every time it is read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_a_short_list_is_done_at_once_with_no_turn_given_up():
    clock = task.Clock()
    done = in_turns(clock, [1, 2, 3], lambda n: n * 2, slice_seconds=1.0, timer=Ticks(0.001))
    assert done.result == [2, 4, 6] and not clock.getDelayedCalls()


def test_a_long_list_gives_the_reactor_back_once_a_slice_has_taken_its_time():
    """Each item 'takes' 4 ms, slices 10 ms: three items a turn, in order, and the rest later."""
    clock, seen = task.Clock(), []
    done = in_turns(clock, range(10), lambda n: seen.append(n) or n, slice_seconds=0.01, timer=Ticks(0.004))
    assert seen == [0, 1, 2] and not done.called and len(clock.getDelayedCalls()) == 1
    clock.advance(0)  # task.Clock runs the later slices' zero-delay calls in this one advance
    assert done.result == list(range(10)) and seen == list(range(10))


def test_an_error_fails_the_deferred_and_stops_the_work():
    clock, seen = task.Clock(), []

    def work(n: int) -> int:
        seen.append(n)
        if n == 4:
            raise ValueError("no")
        return n

    done = in_turns(clock, range(10), work, slice_seconds=0.01, timer=Ticks(0.004))
    clock.advance(0)
    failures = []
    done.addErrback(failures.append)
    assert seen == [0, 1, 2, 3, 4] and failures[0].check(ValueError)


def test_an_item_known_to_be_long_ends_its_slice_at_once():
    """pause_after: a large merge is followed by a turn given back, however fast the timer says it was."""
    clock, seen = task.Clock(), []
    done = in_turns(clock, range(5), seen.append, slice_seconds=1.0, timer=Ticks(0.001), pause_after=lambda n: n == 1)
    assert seen == [0, 1] and not done.called
    clock.advance(0)
    assert seen == [0, 1, 2, 3, 4] and done.called
