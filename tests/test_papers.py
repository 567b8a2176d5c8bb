"""papers.py: the source papers named by authors and title in what users read."""

import re

import pytest

from dpaudit.papers import PAPERS, cite, humanize


@pytest.mark.parametrize("text,expected", [
    ("Seed 001 Figure 3 (b)", 'Azize, "Some Targets Are Harder to Identify than Others" '
                              "Figure 3 (b)"),
    ("seed 001's predicted mean", 'Azize\'s ("Some Targets Are Harder to Identify than '
                                  'Others") predicted mean'),
    ("Seed 004 (Tan et al.) Theorem 3.2", 'Tan et al., "Parameters or Privacy" Theorem 3.2'),
    ("Seed 001 (Algorithm 3) ranks", 'Azize, "Some Targets Are Harder to Identify than '
                                     'Others" (Algorithm 3) ranks'),
    ("the seed 3 run and seed 123", "the seed 3 run and seed 123"),  # not a paper reference
])
def test_humanize(text, expected):
    assert humanize(text) == expected


def test_two_papers_and_unknown_numbers():
    assert humanize("Seed 000/001 Figure 2").count('"') == 4
    with pytest.raises(ValueError, match="no source paper '009'"):
        cite("009")
    assert set(PAPERS) == {"000", "001", "002", "003", "004"}


def test_help_names_papers_not_files_and_cuts_nothing():
    from dpaudit.conf import help_text

    text = help_text()
    assert re.search(r"[Ss]eed 00\d", text) is None
    assert re.search(r"\(issue \d", text) is None
    assert not [line for line in text.splitlines() if line.rstrip().endswith("...")]
    assert 'Koskela & Mohammadi, "Auditing Differential Privacy Guarantees' in text
