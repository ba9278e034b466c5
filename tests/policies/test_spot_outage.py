"""The expected rest of a spot outage (policies/spot_outage.py)."""

from policies.spot_outage import expected_outage_left


def test_an_outage_is_expected_to_last_the_past_mean_and_at_least_as_long_again():
    assert expected_outage_left(mean_past=3.0, so_far=1.0) == 2.0  # the mean's rest
    assert expected_outage_left(mean_past=3.0, so_far=2.0) == 2.0  # as long again
    assert expected_outage_left(mean_past=1.0, so_far=4.0) == 4.0  # past the mean
    assert expected_outage_left(mean_past=0.0, so_far=0.0) == 0.0
