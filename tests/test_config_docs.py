"""config/README.md documents every key of the schema and is regenerated from it."""
from qerl.commands.config_docs import render


def test_config_readme_is_current(repo_root):
    assert (repo_root / "config" / "README.md").read_text() == render(), \
        "config/README.md is stale: run `qerl config-docs --out config/README.md`"


def test_every_key_documented():
    text = render()
    for key in ("`data.tiny.n_test_per_level`", "`quantize.calibration.seq_len`", "`tiny_model.pretrain.lr`"):
        assert key in text
