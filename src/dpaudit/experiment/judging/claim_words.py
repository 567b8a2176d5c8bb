"""The user's claim in words: its head ("your epsilon 2.99 (delta 1e-05, PRV accountant)") and
its bracket, every number through ``report.numbers`` (bounds rounded outward), shared by the
block's sentence (``premises``) and the verdict's first paragraph (``verdict``)."""

from __future__ import annotations

from dpaudit.report.numbers import level as level_words
from dpaudit.report.numbers import lower, point, upper


def sentence_case(text: str) -> str:
    """``text`` with its first letter capitalised (the rest unchanged)."""
    return text[:1].upper() + text[1:]


def claim_head(td: dict) -> str:
    """"your epsilon 2.99 (PRV accountant, delta 1e-05)": the user's accountant and delta,
    with the delta's origin when the user did not give it."""
    claim = td.get("claim") or {}
    delta = f"{td['delta']:.2g}"
    where = (f"at dpaudit's default delta {delta}, not yours: pass delta="
             if claim and not claim.get("delta_given", True) else f"delta {delta}")
    which = f"{td['accountant'].upper()} accountant"
    if claim and claim.get("history") is None and claim.get("accountant_source", "").startswith(
            "no PrivacyEngine"):
        which += " (Opacus' default: no engine given)"
    return f"your epsilon {point(td.get('epsilon_claimed'))} ({which}, {where})"


def bracket_words(td: dict) -> str:
    """The bracket in words: the upper side (verified, or as measured) and the certified
    lower side, each rounded outward, each with its level."""
    up, low = td.get("epsilon_upper"), td.get("epsilon_lower")
    status = td.get("upper_status")
    conf = level_words(td["confidence"])
    if up is None:
        upper_part = "no measured upper side"
    elif status == "verified":
        upper_part = f"verified at most {upper(up)} ({conf})"
    else:
        upper_part = f"at most {upper(up)} as measured ({conf})"
    if low is None:
        return f"{upper_part}; no certified lower side"
    return f"{upper_part}, certified at least {lower(low)} ({conf})"
