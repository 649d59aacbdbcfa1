"""The offline build of the decode step's kernels (qerl_kernels.decode_compile) on the CPU machine: the wrappers'
own launches recorded (the 7B step's grids), built for sm_90 with the bundled ptxas, without spills; run in a fresh
process without TRITON_INTERPRET (the `offline_build` fixture of conftest.py)."""
from __future__ import annotations

import pytest


def test_the_attention_launches_build_for_sm90(offline_build):
    r, rows = offline_build("qerl_kernels.decode_compile", "--rows", "1", "--only", "attention + combine with o's LoRA")
    assert r.returncode == 0 and [row["kernel"] for row in rows] == ["_attn_split_kernel", "_attn_combine_kernel"], \
        (r.stdout, r.stderr[-3000:])
    split, combine = rows
    assert split["grid"] == [1, 4, 16] and combine["grid"] == [1, 28]  # 7B at batch 1, span 1024: 16 key splits
    for row in rows:
        assert row["status"] == "ok" and row["regs"] > 0 and row["spill_st"] == 0, row
        if "sass" in row:  # cuobjdump present: the combine loads its inputs (o's factors among them) up front
            assert row["sass"] > 0 and 0 < row["ldg_before_bar"] <= row["ldg"], row


def test_split_lora_launches_by_rows(monkeypatch):
    """The split LoRA kernels are the step's launches up to each group's decode.lora_split_max_rows; --split-lora
    lists them at any rows (what they would take there), in place of the plain norm and SiLU the engine runs there."""
    from qerl_kernels import decode, decode_compile
    split = {"norm + q/k/v LoRA", "norm + gate/up LoRA", "silu + down LoRA"}
    monkeypatch.setenv("QERL_LORA_SPLIT_ROWS", "q/k/v=1,gate/up=1,down=4")
    assert split <= set(decode_compile.launches(1))
    assert set(decode_compile.launches(2)) & (split | {"norm", "silu"}) == {"silu + down LoRA", "norm"}
    assert not split & set(decode_compile.launches(5)) and {"norm", "silu"} <= set(decode_compile.launches(5))
    assert split <= set(decode_compile.launches(5, split_lora=True))
    monkeypatch.setenv("QERL_LORA_SPLIT_ROWS", "qkv=2")
    with pytest.raises(ValueError, match="QERL_LORA_SPLIT_ROWS.*qkv=2.*q/k/v"):
        decode.lora_split_max_rows()
    monkeypatch.delenv("QERL_LORA_SPLIT_ROWS")
    assert decode.lora_split_max_rows() == decode.LORA_SPLIT_MAX_ROWS
