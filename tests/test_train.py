"""Chapter 11 trainer: schedule, loop, checkpoints, exact resume and the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from course_attn.data.tasks import CopyTask, RecallTask
from course_attn.data.text import CharCorpus
from course_attn.models.gpt import GPTConfig, MiniGPT
from course_attn.train import (
    PRESETS,
    TrainConfig,
    amp_dtype,
    check_preset_device,
    gpu_peak_flops,
    learning_rate,
    load_checkpoint,
    main,
    model_from_checkpoint,
    train,
)

TASK = CopyTask(vocab_size=6, half_length=4)


def tiny_model(dropout: float = 0.0) -> MiniGPT:
    torch.manual_seed(0)
    return MiniGPT(GPTConfig(vocab_size=6, context_length=TASK.context_length, n_layers=1,
                             n_heads=2,
                             d_model=16, dropout=dropout))


def quick(**overrides) -> TrainConfig:
    options = dict(max_iters=6, batch_size=4, eval_interval=3, eval_iters=2, warmup_iters=2,
                   device="cpu", progress=False)
    options.update(overrides)
    return TrainConfig(**options)


def test_learning_rate_warmup_then_cosine_to_min():
    config = TrainConfig(max_iters=100, lr=1.0, min_lr=0.1, warmup_iters=10)
    lrs = [learning_rate(it, config) for it in range(120)]
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:11], strict=True))  # warmup rises
    assert lrs[10] == pytest.approx(1.0)
    assert lrs[55] == pytest.approx(0.1 + 0.5 * 0.9)  # halfway down the cosine
    assert all(a >= b for a, b in zip(lrs[10:100], lrs[11:101], strict=True))
    assert lrs[100] == lrs[119] == pytest.approx(0.1)
    assert learning_rate(50, TrainConfig(lr=2.0, warmup_iters=0, max_iters=50)) == 0.2


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        (dict(max_iters=0), ValueError, "max_iters"),
        (dict(lr=-1e-3), ValueError, "lr"),
        (dict(lr=1e-3, min_lr=1e-2), ValueError, "min_lr"),
        (dict(beta2=1.0), ValueError, "beta2"),
        (dict(grad_clip=float("nan")), ValueError, "grad_clip"),
        (dict(warmup_iters=-1), ValueError, "warmup_iters"),
        (dict(device="tpu"), ValueError, "device"),
        (dict(amp="yes"), TypeError, "amp"),
    ],
)
def test_train_config_validation(options, error, match):
    with pytest.raises(error, match=match):
        TrainConfig(**options)


def test_train_records_history_and_speed():
    model = tiny_model()
    result = train(model, TASK, quick())
    assert len(result.train_losses) == 6 and all(math.isfinite(x) for x in result.train_losses)
    assert result.eval_iters == [3, 6]
    assert len(result.eval_val_losses) == 2 and result.final_val_loss == result.eval_val_losses[-1]
    assert result.ms_per_iter > 0 and result.tokens_per_s > 0
    assert result.n_params == model.num_parameters() and result.device == "cpu"
    metrics = result.to_metrics()
    assert metrics["torch_version"] == torch.__version__
    json.dumps(metrics)  # plain data only


def test_train_seconds_count_the_training_steps_alone(monkeypatch):
    """MFU over training steps (chapter 11) needs their time without evaluation or callbacks.

    A fake clock: each training step takes 1 s, each evaluation 100 s, each on_eval
    callback 1000 s. Only the steps may count, and not the first (kernel selection and
    compilation happen there).
    """
    from course_attn.train import loop

    clock = [0.0]
    real_lr, real_estimate = loop._scheduled_lr, loop.estimate_loss

    def step_lr(it, config):  # called once per training step (the loop's unchecked schedule)
        clock[0] += 1.0
        return real_lr(it, config)

    def slow_estimate(*args, **kwargs):
        clock[0] += 100.0
        return real_estimate(*args, **kwargs)

    def slow_callback(iteration, model, result):
        clock[0] += 1000.0

    monkeypatch.setattr(loop.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(loop, "_scheduled_lr", step_lr)
    monkeypatch.setattr(loop, "estimate_loss", slow_estimate)
    config = quick(max_iters=6, eval_interval=2, eval_iters=2)
    result = train(tiny_model(), TASK, config, on_eval=slow_callback)
    assert result.elapsed_s == 6 * 1.0 + 3 * 100.0 + 3 * 1000.0
    assert result.timed_iters == config.max_iters - 1  # the first iteration is left out
    assert result.train_seconds == 5 * 1.0  # the five timed steps, nothing else
    assert result.ms_per_iter == 1e3 * result.train_seconds / result.timed_iters
    per_batch = TASK.context_length * config.batch_size
    assert result.tokens_per_s == per_batch * result.timed_iters / result.train_seconds
    metrics = result.to_metrics()
    assert (metrics["train_seconds"], metrics["timed_iters"]) == (5.0, 5)


def test_on_the_cpu_the_trainer_takes_fused_adamw(monkeypatch):
    """The fastest AdamW form on the CPU (``step_cost.update_ms``, chapter 11)."""
    seen: dict[str, dict] = {}
    real_adamw = torch.optim.AdamW

    def adamw(*args, **kwargs):
        seen["adamw"] = kwargs
        return real_adamw(*args, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", adamw)
    train(tiny_model(), TASK, quick(max_iters=2))
    assert seen["adamw"]["fused"] is True and seen["adamw"]["foreach"] is False


def test_losses_are_read_back_in_stretches_but_every_iteration_is_kept(monkeypatch):
    """One read-back (a host-device sync on a GPU) per log_interval, not per iteration."""
    read_backs = []
    real_tolist = torch.Tensor.tolist

    def counting_tolist(self):
        read_backs.append(self.numel())
        return real_tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)
    result = train(tiny_model(), TASK, quick(max_iters=25, eval_interval=25, log_interval=10))
    assert len(result.train_losses) == 25 and all(math.isfinite(x) for x in result.train_losses)
    # the first iteration alone (warm-up, left out of the timing), then 9, 10 and the last 5
    assert read_backs == [1, 9, 10, 5]
    with pytest.raises(ValueError, match="log_interval"):
        TrainConfig(log_interval=0)


@pytest.mark.parametrize(
    ("device", "amp", "bf16_native", "expected"),
    [
        ("cuda", True, True, torch.bfloat16),  # A100, H100: native bf16, no scaler
        ("cuda:1", True, True, torch.bfloat16),
        ("cuda", True, False, torch.float16),  # T4, V100: fp16 with a GradScaler
        ("cuda", False, True, None),  # --no-amp
        ("cpu", True, True, None),  # the CPU trains in float32
        ("mps", True, False, None),
    ],
)
def test_mixed_precision_follows_what_the_gpu_supports_natively(device, amp, bf16_native,
                                                                 expected):
    assert amp_dtype(device, amp=amp, bf16_native=bf16_native) is expected


def test_mixed_precision_asks_torch_about_native_bf16_only(monkeypatch):
    asked = []

    def is_bf16_supported(including_emulation=True):
        asked.append(including_emulation)
        return including_emulation  # a T4: emulated bf16 only

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert amp_dtype(torch.device("cuda")) is torch.float16
    assert asked == [False]


def test_the_gpu_preset_refuses_a_cpu_and_says_what_it_would_cost():
    with pytest.raises(ValueError) as error:
        check_preset_device("gpu", "cpu", cpu_flops=100e9)
    message = str(error.value)
    sizes = PRESETS["gpu"]
    tokens = sizes["max_iters"] * sizes["batch_size"] * sizes["context_length"]
    with torch.device("meta"):
        model = MiniGPT(GPTConfig(vocab_size=65, context_length=sizes["context_length"],
                                  n_layers=sizes["n_layers"], n_heads=sizes["n_heads"],
                                  d_model=sizes["d_model"]))
    hours = model.flops_per_token() * tokens / 100e9 / 3600
    assert f"{model.num_parameters() / 1e6:.1f}M-parameter" in message
    assert f"at least {hours:.0f} hours" in message and "--device cpu" in message
    check_preset_device("gpu", "cuda", cpu_flops=100e9)  # a GPU: fine
    check_preset_device("cpu", "cpu")  # the cpu preset: fine
    with pytest.raises(ValueError, match="preset"):
        check_preset_device("tpu", "cpu")


def test_flops_per_token_follows_the_palm_estimate():
    model = tiny_model()
    c = model.config
    weights = model.num_parameters(non_embedding=True)
    assert model.flops_per_token() == 6 * weights + 12 * c.n_layers * c.context_length * c.d_model


def test_training_lowers_the_loss_on_the_copy_task():
    model = tiny_model()
    result = train(model, TASK, quick(max_iters=300, batch_size=16, eval_interval=300,
                                      eval_iters=4, lr=1e-2))
    # ln 6 = 1.79 is the loss of guessing; the floor is 0.77. Learning to copy shows.
    assert result.final_val_loss < TASK.loss_floor() + 0.2 < math.log(6) - 0.8
    assert result.final_val_loss > TASK.loss_floor() - 0.05
    # The two splits of a task are different random draws, so their losses differ.
    assert result.final_train_loss != result.final_val_loss


def test_train_rejects_bad_arguments():
    with pytest.raises(TypeError, match="model"):
        train(torch.nn.Linear(2, 2), TASK, quick())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config"):
        train(tiny_model(), TASK, {"max_iters": 2})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="get_batch"):
        train(tiny_model(), [1, 2, 3], quick())  # type: ignore[arg-type]


def test_checkpoint_round_trip(tmp_path):
    corpus = CharCorpus.from_text("abcabcabd" * 20)
    torch.manual_seed(0)
    model = MiniGPT(GPTConfig(vocab_size=corpus.vocab_size, context_length=8, n_layers=1, n_heads=1,
                              d_model=8))
    path = tmp_path / "ckpt.pt"
    train(model, corpus, quick(max_iters=2, eval_interval=2), checkpoint_path=path,
          meta={"tokenizer_chars": corpus.tokenizer.chars})
    checkpoint = load_checkpoint(path)  # weights_only=True inside
    assert checkpoint["iter"] == 2 and len(checkpoint["history"]["train_losses"]) == 2
    restored, tokenizer = model_from_checkpoint(path)
    assert tokenizer is not None and tokenizer.chars == corpus.tokenizer.chars
    x, _ = corpus.get_batch("val", 2, 8)
    torch.testing.assert_close(restored(x)[0], model.cpu().eval()(x)[0])
    # Only plain data: a strict weights-only load succeeds on the raw file too.
    torch.load(path, weights_only=True)


def test_resume_reproduces_the_uninterrupted_run_exactly(tmp_path):
    # dropout > 0 so that the global RNG state matters too; the schedule is fixed
    # by lr_decay_iters, so stopping early does not change the learning rates.
    options = dict(max_iters=8, lr_decay_iters=8, eval_interval=4)
    full = train(tiny_model(0.1), TASK, quick(**options))
    path = tmp_path / "half.pt"
    train(tiny_model(0.1), TASK, quick(**{**options, "max_iters": 4}), checkpoint_path=path)
    resumed = train(tiny_model(0.1), TASK, quick(**options), resume_from=path)
    assert resumed.train_losses == full.train_losses  # exact, not approximate
    assert resumed.eval_val_losses == full.eval_val_losses
    assert len(set(full.train_losses)) > 1


def written_before_the_renames(checkpoint: dict) -> dict:
    """``checkpoint`` as the trainer wrote it before issue 17 renamed the model's names:
    ``n_layer``/``n_head`` in its config, ``tok_emb``/``pos_emb``/``ln_f`` in its weights,
    and without the config fields added since (``pos_encoding``, ``n_kv_heads``, ``window``)."""
    config_keys = {"n_layers": "n_layer", "n_heads": "n_head"}
    prefixes = {"embed.": "tok_emb.", "pos.": "pos_emb.", "norm.": "ln_f."}

    def old_name(key: str) -> str:
        return next((old + key.removeprefix(new) for new, old in prefixes.items()
                     if key.startswith(new)), key)

    return {**checkpoint,
            "model_config": {config_keys.get(k, k): v for k, v in
                             checkpoint["model_config"].items()
                             if k not in ("pos_encoding", "n_kv_heads", "window")},
            "model": {old_name(k): v for k, v in checkpoint["model"].items()}}


def test_a_checkpoint_from_before_the_renames_loads_and_resumes_exactly(tmp_path):
    options = dict(max_iters=8, lr_decay_iters=8, eval_interval=4)
    full = train(tiny_model(0.1), TASK, quick(**options))
    path = tmp_path / "old.pt"
    train(tiny_model(0.1), TASK, quick(**{**options, "max_iters": 4}), checkpoint_path=path)
    today = torch.load(path, weights_only=True)
    old = written_before_the_renames(today)
    assert {"n_layer", "n_head"} <= set(old["model_config"]) and "n_layers" not in old[
        "model_config"]
    assert {"tok_emb.weight", "pos_emb.weight", "ln_f.weight", "ln_f.bias"} <= set(old["model"])
    torch.save(old, path)
    model, _ = model_from_checkpoint(path)
    torch.testing.assert_close(model.state_dict(), today["model"], rtol=0, atol=0)
    assert model_from_checkpoint(old)[0].config == model.config
    assert "tok_emb.weight" in old["model"]  # the caller's dict is left as it was
    resumed = train(tiny_model(0.1), TASK, quick(**options), resume_from=path,
                    checkpoint_path=path)
    assert resumed.train_losses == full.train_losses  # exact, as from a new checkpoint
    assert resumed.eval_val_losses == full.eval_val_losses
    rewritten = load_checkpoint(path)  # the resumed run writes today's names
    assert rewritten["model_config"]["n_layers"] == 1 and "embed.weight" in rewritten["model"]


def test_resume_refuses_another_model(tmp_path):
    path = tmp_path / "ckpt.pt"
    train(tiny_model(), TASK, quick(max_iters=3), checkpoint_path=path)
    other = MiniGPT(GPTConfig(vocab_size=6, context_length=TASK.context_length, n_layers=2,
                              n_heads=2,
                              d_model=16))
    with pytest.raises(ValueError, match="different model configuration"):
        train(other, TASK, quick(), resume_from=path)
    not_a_checkpoint = tmp_path / "x.pt"
    torch.save({"weights": torch.zeros(1)}, not_a_checkpoint)
    with pytest.raises(ValueError, match="not a course_attn training checkpoint"):
        load_checkpoint(not_a_checkpoint)


# ----------------------------------------------------------------------- CLI
TINY = ["--n-layers", "1", "--n-heads", "2", "--d-model", "16", "--context-length", "8",
        "--batch-size", "4", "--eval-interval", "2", "--eval-iters", "2", "--device", "cpu",
        "--quiet"]


@pytest.fixture()
def corpus_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("the cat sat on the mat. the dog sat on the log.\n" * 30, encoding="utf-8")
    return path


def test_cli_trains_on_a_text_file_and_writes_metrics(tmp_path, corpus_file, capsys):
    metrics_path, ckpt = tmp_path / "metrics.json", tmp_path / "ckpt.pt"
    code = main(["--data", str(corpus_file), *TINY, "--max-iters", "4", "--samples", "12",
                 "--metrics-out", str(metrics_path), "--out", str(ckpt)])
    assert code == 0
    metrics = json.loads(metrics_path.read_text())
    for key in ("train_loss_history", "val_loss_history", "final_train_loss", "final_val_loss",
                "ms_per_iter", "tokens_per_s", "n_params", "device", "torch_version"):
        assert key in metrics, key
    assert len(metrics["train_loss_history"]) == 4 and metrics["eval_iters"] == [2, 4]
    assert metrics["final_val_loss"] == metrics["val_loss_history"][-1] > 0
    assert metrics["device"] == "cpu" and metrics["model_config"]["n_layers"] == 1
    assert "sample:" in capsys.readouterr().out
    # Resume for two more iterations, the schedule kept where it ended (iteration 4).
    code = main(["--data", str(corpus_file), *TINY, "--max-iters", "6", "--lr-decay-iters", "4",
                 "--samples", "0", "--resume", str(ckpt), "--metrics-out", str(metrics_path)])
    resumed = json.loads(metrics_path.read_text())
    assert code == 0 and resumed["train_loss_history"][:4] == metrics["train_loss_history"]
    assert len(resumed["train_loss_history"]) == 6


def test_cli_runs_with_one_seed_repeat_each_other(tmp_path, corpus_file):
    """--seed fixes the initial weights too, so two runs give the same losses."""
    runs = []
    for name in ("a.json", "b.json"):
        code = main(["--data", str(corpus_file), *TINY, "--max-iters", "3", "--samples", "0",
                     "--seed", "7", "--metrics-out", str(tmp_path / name)])
        assert code == 0
        runs.append(json.loads((tmp_path / name).read_text())["train_loss_history"])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("task", [CopyTask(), RecallTask()])
def test_cli_task_reports_the_floor(tmp_path, task):
    metrics_path = tmp_path / "m.json"
    name = {CopyTask: "copy", RecallTask: "recall"}[type(task)]
    code = main(["--task", name, "--n-layers", "1", "--n-heads", "1", "--d-model", "8",
                 "--batch-size", "2", "--max-iters", "2", "--eval-iters", "1", "--device",
                 "cpu", "--quiet", "--metrics-out", str(metrics_path)])
    metrics = json.loads(metrics_path.read_text())
    assert code == 0 and metrics["loss_floor"] == pytest.approx(task.loss_floor())
    assert metrics["model_config"]["context_length"] == task.context_length
    assert metrics["model_config"]["vocab_size"] == task.vocab_size


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "no/such/file.txt"], "not an existing file"),
        # A value is judged by GPTConfig's or TrainConfig's own check, naming the flag.
        (["--lr", "-1"], "argument --lr: lr must be a positive finite number, got -1.0"),
        (["--max-iters", "0"], "argument --max-iters: max_iters must be a positive int, got 0"),
        (["--max-iters", "2.5"], "argument --max-iters: invalid int value: '2.5'"),
        (["--dropout", "1.5"], "argument --dropout: dropout must be in [0, 1)"),
        (["--preset", "tpu"], "invalid choice"),
        (["--impl", "flash"],
         "invalid choice: 'flash' (choose from 'manual', 'sdpa', 'tiled', 'triton', 'flex')"),
        (["--n-heads", "3"], "argument --n-heads/--d-model: d_model=128 must be divisible"),
        (["--samples", "-1"], "argument --samples: expected an integer >= 0, got -1"),
        (["--resume", "missing.pt"], "not an existing file"),
        (["--metrics-out", "no/such/dir/m.json"], "does not exist"),
        (["--task", "copy", "--context-length", "8"], "fixes it"),
        (["--context-length", "4096"], "too short"),
        (["--device", "tpu"], "device"),
    ],
)
def test_cli_bad_input_exits_with_code_2(args, message, corpus_file, capsys):
    if "--data" not in args and "--task" not in args:
        args = ["--data", str(corpus_file), *args]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_gpu_preset_without_a_gpu_stops_before_training(monkeypatch, capsys):
    import course_attn.train.cli as cli

    monkeypatch.setattr(cli, "pick_device", lambda preferred=None: torch.device("cpu"))
    monkeypatch.setattr(cli, "train", lambda *a, **k: pytest.fail("training started"))
    with pytest.raises(SystemExit) as exit_info:
        main(["--task", "copy", "--preset", "gpu"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--preset gpu" in err and "no GPU was found" in err and "hours" in err


def test_cli_help_runs_as_a_module_without_warnings():
    done = subprocess.run([sys.executable, "-W", "error", "-m", "course_attn.train", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for flag in ("--data", "--task", "--preset", "--resume", "--metrics-out", "--impl"):
        assert flag in done.stdout


def test_gpu_peak_flops_table():
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert gpu_peak_flops("NVIDIA H100 PCIe") == 756e12  # the PCIe card is slower
    assert gpu_peak_flops("Tesla T4") == 65e12 and gpu_peak_flops("NVIDIA A100-SXM4-40GB") == 312e12
    assert gpu_peak_flops("a CPU") is None
    with pytest.raises(TypeError, match="name"):
        gpu_peak_flops(None)  # type: ignore[arg-type]
