"""qerl.provenance: the stamp a stage writes and the header line an artifact prints, from one module."""
from __future__ import annotations

from qerl.provenance import Provenance, git_commit, host_hardware, provenance


def test_short_commit_is_the_start_of_the_full_one(tmp_path):
    full, short = git_commit(), git_commit(short=True)
    assert full == short == "unknown" or full.startswith(short)
    assert git_commit(tmp_path) == git_commit(tmp_path, short=True) == "unknown"  # not a git checkout


def test_a_named_commit_wins_over_the_git_metadata(tmp_path, monkeypatch):
    """A copied checkout whose git metadata is older than its files names its commit in QERL_COMMIT
    (workflow/run_device.sh sets it from COMMIT): stamps and headers say that one, also outside a git checkout."""
    monkeypatch.setenv("QERL_COMMIT", "301549f0123456789abcdef")
    assert git_commit() == git_commit(tmp_path) == "301549f0123456789abcdef"
    assert git_commit(short=True) == "301549f" and provenance()["commit"] == "301549f0123456789abcdef"
    monkeypatch.setenv("QERL_COMMIT", "")
    assert git_commit(tmp_path) == "unknown"


def test_a_stage_stamp_reads_back_into_a_header():
    stamp = provenance()
    assert stamp["hardware"]["cpu"] and stamp["commit"]
    prov = Provenance(scale="tiny", model="tiny", seeds=[0, 1])
    prov.add(stamp)
    fields = prov.fields()
    expected = f"GPU {stamp['hardware']['gpu']}" if stamp["hardware"].get("gpu") else f"CPU {stamp['hardware']['cpu']}"
    assert fields["hardware"] == expected and fields["seeds"] == "0, 1"
    assert host_hardware().split()[0] in ("GPU", "CPU")
