"""The legend diagnosis on the committed weights: it finds each asked key cell (the cell names
its own glyph after layer 0, the glyph target), counts every question once per column, and
reads what NOTES reports: the letter column answered right on most questions, and the key
cell's last layer resolving the digit under "#1" on most."""

from conduit_core.model.testbed_model import WEIGHTS
from lab.testbed.legends import legend_counts
from lab.testbed.pairs import load_model


def test_the_legend_diagnosis_reads_the_asked_key_cell():
    model, layouts, patches = load_model(WEIGHTS)
    counts = legend_counts(model, layouts, patches, n=24, seed=0)
    assert set(counts) == {"digit", "letter"}
    assert sum(c["n"] for c in counts.values()) == 24
    for c in counts.values():
        n = c["n"]
        assert sum(c.get(f"answer_{k}", 0) for k in ("right", "other_value", "else")) == n
        assert (c.get("answer_right_where_read_right", 0)
                + c.get("answer_right_where_read_wrong", 0)) == c.get("answer_right", 0)
        assert c.get("answer_right_where_read_right", 0) <= c.get("L3_right", 0)
        assert c.get("L0_key", 0) >= 0.6 * n  # the asked key cell (87% of 256 in NOTES)
        assert c.get("L4_right", 0) >= 0.7 * n  # resolved at the last layer
    assert counts["letter"].get("answer_right", 0) >= 0.8 * counts["letter"]["n"]
