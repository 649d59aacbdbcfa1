"""qerl.profiling.share_gpu on the CPU: K worker processes start together and every count gets its row."""
import json

from qerl.profiling import share_gpu


def test_rows_per_process_count(tmp_path):
    out = tmp_path / "share.json"
    assert share_gpu.main(["--procs", "1", "2", "--batch", "2", "--steps", "3", "--prompt", "4", "--reps", "1",
                           "--layers", "1", "--hidden", "64", "--rank", "4", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [r["procs"] for r in rows] == [1, 2]
    assert all(len(r["steps_per_s_each"]) == r["procs"] and min(r["steps_per_s_each"]) > 0 for r in rows)
    assert rows[0]["speedup_vs_one"] == 1.0 and rows[1]["speedup_vs_one"] > 0
    assert not list(tmp_path.glob("*.tmp"))  # written whole
