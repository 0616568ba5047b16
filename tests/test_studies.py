"""Study sections (analysis/studies.py): closed forms worked out by hand, and the windows on a synthetic sweep."""

import math

import pytest

from analysis.studies import closed_form_weight


def test_closed_form_group_weight_by_hand():
    # G = 8, k = 4: |r - 1/2| = 1/2 for all 8 -> sum 4; std (ddof 1) = sqrt(8 * 1/4 / 7) = sqrt(2/7) = 0.53452
    assert closed_form_weight(4, 8, "group", eps=0.0) == pytest.approx(4 / math.sqrt(2 / 7))   # 7.4833
    assert closed_form_weight(4, 8, "none") == pytest.approx(4.0)
    # k = 1: sum |r - 1/8| = 7/8 + 7 * 1/8 = 1.75; std = sqrt((49/64 + 7/64) / 7) = sqrt(1/8) = 0.35355
    assert closed_form_weight(1, 8, "group", eps=0.0) == pytest.approx(1.75 / math.sqrt(1 / 8))  # 4.9497
    assert closed_form_weight(1, 8, "none") == pytest.approx(1.75)
    # the shapes: hard/easy vs balanced group = sqrt(7)/4 with std scaling, 7/16 without
    assert closed_form_weight(1, 8, "group", 0.0) / closed_form_weight(4, 8, "group", 0.0) == pytest.approx(math.sqrt(7) / 4)
    assert closed_form_weight(7, 8, "none") / closed_form_weight(4, 8, "none") == pytest.approx(7 / 16)
    # all-equal groups carry no weight
    assert closed_form_weight(0, 8, "group") == closed_form_weight(8, 8, "none") == 0.0
    assert math.isnan(closed_form_weight(3, 8, "batch"))
