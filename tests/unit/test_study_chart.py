"""The study page's chart: both axes carry values and titles, and the legend is laid out
under the plot, inside the picture, whole (it was clipped at the right edge: "contro",
"annou")."""

from __future__ import annotations

import re

from sim.analysis.studyreport import Estimate, StudyReport, _chart


def _report(*conditions: str) -> StudyReport:
    estimates = {
        cond: [Estimate(t, 3, 0.2 * k + 0.1 * t, 0.1 * t, 0.3 + 0.1 * t) for t in (1, 2, 3)]
        for k, cond in enumerate(conditions)
    }
    return StudyReport("state.votes.harbour", "yes=1", conditions[0], estimates, {})


def _width(svg: str) -> float:
    found = re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg)
    assert found
    return float(found.group(1))


def test_the_legend_is_whole_and_inside_the_picture() -> None:
    names = ["control", "announce", "announce-and-remind", "a-much-longer-arm-name-here"]
    svg = _chart(_report(*names))
    width = _width(svg)
    for name in names:
        label = re.search(rf'<text x="([\d.]+)" y="[\d.]+" font-size="12">{name}</text>', svg)
        assert label, name  # whole, not cut
        assert float(label.group(1)) + 7 * len(name) <= width
    height = float(re.search(r'viewBox="0 0 [\d.]+ ([\d.]+)"', svg).group(1))  # type: ignore[union-attr]
    ys = [float(y) for y in re.findall(r'<rect x="[\d.]+" y="([\d.]+)"', svg)]
    assert ys and max(ys) + 12 <= height


def test_both_axes_have_values_and_titles() -> None:
    svg = _chart(_report("control", "announce"))
    assert ">state.votes.harbour</text>" in svg and "rotate(-90" in svg  # the y title
    assert ">tick</text>" in svg
    y_values = re.findall(r'text-anchor="end">([-\d.e]+)</text>', svg)
    assert len(y_values) == 5
    for tick in ("1", "2", "3"):
        assert f'text-anchor="middle">{tick}</text>' in svg


def test_a_name_longer_than_a_row_is_shortened_not_drawn_off_the_picture() -> None:
    svg = _chart(_report("control", "x" * 200))
    width = _width(svg)
    label = re.search(r'<text x="([\d.]+)" y="[\d.]+" font-size="12">(x+…)</text>', svg)
    assert label and float(label.group(1)) + 7 * len(label.group(2)) <= width
