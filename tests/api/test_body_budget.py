"""api.body_budget: reservations fit the limit or take nothing."""

from api.body_budget import BodyBudget, Reservation


def test_a_reservation_that_does_not_fit_takes_nothing():
    budget = BodyBudget(100)
    assert budget.reserve(60)
    assert not budget.reserve(41)
    assert budget.reserved == 60
    assert budget.reserve(40)
    budget.release(60)
    assert budget.reserved == 40 and budget.reserve(60)


def test_a_requests_reservation_grows_to_what_its_body_announces_and_goes_back_whole():
    budget = BodyBudget(100, stream_limit=50)
    reservation = Reservation(budget)
    assert reservation.grow(30) and reservation.grow(20)  # a smaller size holds no more
    assert reservation.grow(70) and budget.reserved == 70
    assert not reservation.grow(101) and (reservation.size, budget.reserved) == (70, 70)
    reservation.release()
    reservation.release()
    assert budget.reserved == 0


def test_a_streamed_bodys_reservation_is_held_against_and_given_back_to_its_share():
    budget = BodyBudget(100, stream_limit=50)
    reservation = Reservation(budget)
    assert not reservation.grow(60, streamed=True) and budget.reserved == 0
    assert reservation.grow(40, streamed=True) and budget.streamed == 40
    reservation.release()
    assert (budget.reserved, budget.streamed) == (0, 0)
