"""A relative change shown as a percentage on the report pages: an interval without bounds (compare's
`rel_ci` of a metric within the noise floor is [null, null]) shows "-" instead of failing the page."""
from loadgen.report.tables import Key, text


def test_pct_cells_with_and_without_bounds():
    row = {"m": {"rel": -0.25, "rel_ci": [-0.3, -0.2], "none": [None, None], "missing": None}}
    assert text(Key("m.rel", pct=True), row) == "-25.0%"
    assert text(Key("m.rel_ci", pct=True), row) == "-30.0% – -20.0%"
    assert text(Key("m.none", pct=True), row) == "- – -"
    assert text(Key("m.missing", pct=True), row) == "-"
