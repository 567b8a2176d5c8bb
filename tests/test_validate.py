"""The one way an unknown name is refused (``_validate``): the parameter, what was given, the
closest valid names ("did you mean") and the allowed ones."""

import pytest

from dpaudit._validate import did_you_mean, require_choice, require_known


def test_did_you_mean_names_the_closest_valid_names_only():
    assert did_you_mean("noise_multipler", ["noise_multiplier", "max_grad_norm"]) == \
        " (did you mean 'noise_multiplier'?)"
    assert did_you_mean("mpl", ("logreg", "mlp", "cnn")) == " (did you mean 'mlp'?)"
    assert did_you_mean("per_layr", ("flat", "per_layer", "adaptive")) == \
        " (did you mean 'per_layer'?)"
    assert did_you_mean("Scalar", ("scalar", "glir")) == " (did you mean 'scalar'?)"
    # several close ones, closest first; nothing close, or not a name: no suggestion
    assert did_you_mean("gradient_dirc", ["input", "gradient_dirac", "gradient_poisson"]) \
        .startswith(" (did you mean 'gradient_dirac'")
    assert did_you_mean("zzz", ("flat", "per_layer")) == ""
    assert did_you_mean(3, ("3", "4")) == ""
    assert did_you_mean("x", ()) == ""


def test_require_choice_and_require_known_say_what_was_meant():
    with pytest.raises(ValueError) as err:
        require_choice("dp.clipping", "per_layr", ("flat", "per_layer", "adaptive"))
    assert str(err.value) == ("dp.clipping must be one of ('flat', 'per_layer', 'adaptive'), "
                              "got 'per_layr' (did you mean 'per_layer'?)")
    require_choice("dp.clipping", "flat", ("flat", "per_layer"))  # a valid one passes
    with pytest.raises(ValueError, match=r"must be one of \('a',\), got \[1\]$"):
        require_choice("k", [1], {"a": 1})  # unhashable: refused, never a TypeError
    with pytest.raises(ValueError) as err:
        require_known("dp setting", ["noise_multipler", "lr", "bogus"],
                      ["noise_multiplier", "lr", "delta"])
    assert str(err.value) == ("unknown dp setting 'noise_multipler' (did you mean "
                              "'noise_multiplier'?), 'bogus'; allowed: delta, lr, "
                              "noise_multiplier")
    require_known("dp setting", ["lr"], ["lr"])
