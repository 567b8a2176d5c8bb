"""The user's claim in words: its head ("your epsilon 2.99 (delta 1e-05, PRV accountant)") and
its bracket, every number through ``report.numbers`` (bounds rounded outward), shared by the
block's sentence (``premises``) and the verdict's first paragraph (``verdict``)."""

from __future__ import annotations

from dpaudit.report.numbers import level as level_words
from dpaudit.report.numbers import lower, point, upper


def upper_notes(td: dict) -> list[str]:
    """What the upper side's sentence must not leave out: tensors with too few noise draws
    to bound tightly (named, never averaged away), and a GDP claim that is not an upper
    bound on its own history (a sound accountant's lower end above it)."""
    out = []
    few = (td.get("upper_noise") or {}).get("too_few_draws") or []
    if few:
        names = ", ".join(few[:2]) + (f" and {len(few) - 2} more" if len(few) > 2 else "")
        out.append(f"too few noise draws to bound {names} tightly: the upper side takes their "
                   "loose bounds")
    short = td.get("claim_shortfall") or {}
    if short.get("claim_is_upper_bound") is False:
        out.append(f"your GDP claim is not an upper bound on this history: the PRV accountant "
                   f"puts it at least at {lower(short['epsilon_sound_lower'])} "
                   f"({short['ratio']:.3g}x the claim)")
    return out


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
    one = td.get("epsilon_upper_one_scale")
    one = (f"; {upper(one)} if every tensor and step shares one noise scale"
           if one is not None and up is not None and upper(one) != upper(up) else "")
    if up is None:
        upper_part = "no measured upper side"
    elif status == "verified":
        upper_part = f"verified at most {upper(up)} ({conf}{one})"
    else:
        upper_part = f"at most {upper(up)} as measured ({conf}{one})"
    if low is None:
        return f"{upper_part}; no certified lower side"
    return f"{upper_part}, certified at least {lower(low)} ({conf})"
