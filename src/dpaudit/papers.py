"""The source papers, named as a reader knows them (authors and title), for everything a user
sees: ``--help``, warnings, plot titles.

The code and its comments cite the papers by their file in the design notes ("seed 001
Algorithm 4" is ``001_....txt``); users never saw those files, so ``humanize`` rewrites such a
reference into the authors and a short title before it is shown.
"""

from __future__ import annotations

import re

from dpaudit._validate import did_you_mean

PAPERS = {  # file number -> (authors, title)
    "000": ("Azize & Basu", "How Much Does Each Datapoint Leak Your Privacy?"),
    "001": ("Azize", "Some Targets Are Harder to Identify than Others"),
    "002": ("Koskela & Mohammadi", "Auditing Differential Privacy Guarantees Using Density "
            "Estimation"),
    "003": ("Zhang et al.", "A Game-Theoretic Approach to Privacy-Utility Tradeoff in Sharing "
            "Genomic Summary Statistics"),
    "004": ("Tan et al.", "Parameters or Privacy"),
}
_REF = re.compile(r"\b[Ss]eed (\d{3})(?:/(\d{3}))?('s)?(?: \(([^)]*)\))?")


def cite(seed: str) -> str:
    """Authors and title of the source paper numbered ``seed`` ("001")."""
    if seed not in PAPERS:
        raise ValueError(f"no source paper {seed!r}{did_you_mean(seed, PAPERS)}; known: "
                         f"{sorted(PAPERS)}")
    authors, title = PAPERS[seed]
    return f'{authors}, "{title}"'


def humanize(text: str) -> str:
    """``text`` with every "seed 001" (or "Seed 000/001", "seed 001's", "Seed 004 (Tan et
    al.)") replaced by the paper's authors and title."""

    def one(m: re.Match) -> str:
        seeds = [s for s in (m.group(1), m.group(2)) if s]
        if any(s not in PAPERS for s in seeds):
            return m.group(0)
        if m.group(3):  # possessive: "Azize's ("Some Targets ...")"
            out = "; ".join(f'{PAPERS[s][0]}\'s ("{PAPERS[s][1]}")' for s in seeds)
        else:
            out = "; ".join(cite(s) for s in seeds)
        note = m.group(4)
        if note and note not in {a for a, _ in PAPERS.values()}:
            out += f" ({note})"  # a parenthesis that is not just the authors again
        return out

    return _REF.sub(one, text)


__all__ = ["PAPERS", "cite", "humanize"]
