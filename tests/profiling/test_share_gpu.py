"""qerl.profiling.share_gpu on the CPU: K worker processes start together and the count gets its row."""
import json

from qerl.profiling import share_gpu


def test_rows_per_process_count(tmp_path):
    out = tmp_path / "share.json"
    assert share_gpu.main(["--procs", "2", "--batch", "2", "--steps", "3", "--prompt", "4", "--reps", "1",
                           "--layers", "1", "--hidden", "64", "--rank", "4", "--out", str(out)]) == 0
    [row] = json.loads(out.read_text())["results"]
    assert row["procs"] == 2 and len(row["steps_per_s_each"]) == 2 and min(row["steps_per_s_each"]) > 0
    assert row["speedup_vs_one"] is None  # no one-process row to compare with
    assert not list(tmp_path.glob("*.tmp"))  # written whole
