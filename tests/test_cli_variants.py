"""Every model chapter 10 trains is trainable from the command line (issue 26, item 3).

The flags of ``GPTConfig``'s variant fields are derived from the dataclass; the model they
make is saved in the checkpoint, and a resumed run rebuilds the same model.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from course_attn import GPTConfig
from course_attn.train import load_checkpoint, main, model_from_checkpoint
from course_attn.train.cli import OVERRIDES, VARIANTS

RECALL = ["--task", "recall", "--n-layers", "1", "--n-heads", "4", "--d-model", "16",
          "--batch-size", "2", "--eval-interval", "2", "--eval-iters", "1", "--device", "cpu",
          "--quiet"]


def test_every_field_of_the_config_has_a_flag():
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    assert fields - {"vocab_size", "impl"} == set(OVERRIDES) & fields | set(VARIANTS)


def test_a_chapter_10_model_trains_saves_and_resumes_from_the_cli(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    variant = ["--pos-encoding", "rope", "--n-kv-heads", "1", "--window", "5", "--norm", "rms",
               "--activation", "swiglu", "--no-bias"]
    schedule = ["--lr-decay-iters", "4"]  # fixed, so that the run may grow from 2 to 4
    assert main([*RECALL, *variant, *schedule, "--max-iters", "2", "--out", str(ckpt)]) == 0
    checkpoint = load_checkpoint(ckpt)
    saved = checkpoint["model_config"]
    assert (saved["pos_encoding"], saved["n_kv_heads"], saved["window"], saved["norm"],
            saved["activation"], saved["bias"]) == ("rope", 1, 5, "rms", "swiglu", False)
    model, _ = model_from_checkpoint(checkpoint)  # (the model, no tokenizer: a task)
    attn = model.blocks[0].self_attn  # q (width 16) and one key/value head of width 4, fused
    assert (attn.kv_width, attn.qkv_proj.out_features) == (4, 16 + 2 * 4)
    assert isinstance(model.norm, torch.nn.RMSNorm) and model.blocks[0].ff.gated
    # a resumed run is the same run: the same flags rebuild the same model ...
    assert main([*RECALL, *variant, *schedule, "--max-iters", "4", "--resume", str(ckpt),
                 "--out", str(ckpt)]) == 0
    assert load_checkpoint(ckpt)["iter"] == 4


def test_a_different_variant_cannot_resume_the_run(tmp_path, capsys):
    ckpt = tmp_path / "ckpt.pt"
    assert main([*RECALL, "--pos-encoding", "alibi", "--max-iters", "2", "--out", str(ckpt)]) == 0
    with pytest.raises(SystemExit) as info:
        main([*RECALL, "--pos-encoding", "rope", "--max-iters", "2", "--resume", str(ckpt)])
    assert info.value.code == 2
    assert "pos_encoding" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "named"), [
    (["--n-kv-heads", "3"], "--n-kv-heads"),  # does not divide 4 heads
    (["--window", "0"], "--window"),
    (["--norm", "batch"], "--norm"),
    (["--init-std", "-1"], "--init-std"),
])
def test_a_bad_variant_exits_2_naming_its_flag(flags, named, capsys):
    with pytest.raises(SystemExit) as info:
        main([*RECALL, *flags, "--max-iters", "1"])
    assert info.value.code == 2
    assert named in capsys.readouterr().err
