"""Variant names and the mapping of no-op variants onto the default run."""
import pytest

from qerl.config import validate_config
from qerl.contract.variants import canonical_variant, lr_variant, parse_variant


def test_lr_variant_names():
    assert lr_variant(3e-5) == "lr3e-05" and parse_variant(lr_variant(3e-5)) == {"lr": 3e-5}


@pytest.mark.parametrize("method, variant, expected", [
    ("qerl", "aqn-exponential", "default"), ("qerl", "aqn-cosine", "aqn-cosine"), ("qerl", "rank32", "default"),
    ("qerl", "rank16", "rank16"), ("lora", "lr5e-06", "default"), ("qerl", "lr5e-06", "lr5e-06"),
    ("qerl", "lr1e-05", "default"), ("qerl", "noaqn", "noaqn"), ("qerl", "default", "default")])
def test_canonical_variant(method, variant, expected):
    cfg = validate_config({})  # schedule exponential, rank 32, lr 1e-5 (lora 5e-6)
    assert canonical_variant(cfg, method, variant) == expected


def test_unknown_variant():
    with pytest.raises(ValueError, match="unknown variant 'rnak8'"):
        parse_variant("rnak8")
