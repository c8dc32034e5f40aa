"""api.body_budget: reservations fit the limit or take nothing."""

from api.body_budget import BodyBudget


def test_a_reservation_that_does_not_fit_takes_nothing():
    budget = BodyBudget(100)
    assert budget.reserve(60)
    assert not budget.reserve(41)
    assert budget.reserved == 60
    assert budget.reserve(40)
    budget.release(60)
    assert budget.reserved == 40 and budget.reserve(60)
