"""The shared loop, in one process with no Ray: accumulation, precision, resume, models and datasets."""

from __future__ import annotations

import io
import math
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import final_weights, max_abs_diff
from PIL import Image

from trainables.config import TrainConfig
from trainables.data.digits import digits_tensors
from trainables.data.meta import DataMeta
from trainables.local import train_locally
from trainables.models import build_model

FAST = {"model": "digits-cnn", "batch_size": 32, "log_every": 5}


def test_grad_accumulation_equals_the_bigger_batch(tmp_path):
    # SGD: weights move linearly with the gradient, so only float summation order can differ. (Adam divides
    # by sqrt(v) and blows 1e-9 differences in near-zero gradients up to ~lr.)
    sgd = {**FAST, "optimizer": "sgd", "lr": 0.05, "max_steps": 6}
    _, big = train_locally(TrainConfig(**{**sgd, "batch_size": 32}), tmp_path / "big")
    _, acc = train_locally(TrainConfig(**{**sgd, "batch_size": 16}, grad_accum=2), tmp_path / "acc")
    assert max_abs_diff(final_weights(big.checkpoints[-1]), final_weights(acc.checkpoints[-1])) < 1e-5


def test_resume_mid_epoch_gives_identical_weights(tmp_path):
    cfg = TrainConfig(**FAST, epochs=2, checkpoint_every=10)
    _, whole = train_locally(cfg, tmp_path / "whole")
    first = whole.checkpoints[0]  # step 10 of 44 in epoch 0
    assert torch.load(first / "state.pt", weights_only=True)["position"] == {
        "epoch": 0, "batch_in_epoch": 10, "step": 10}
    _, resumed = train_locally(cfg, tmp_path / "resumed", resume=first)
    assert max_abs_diff(final_weights(whole.checkpoints[-1]), final_weights(resumed.checkpoints[-1])) == 0.0


def test_one_checkpoint_per_step_where_max_steps_ends_the_epoch_early(tmp_path):
    """max_steps 20 ends epoch 0 (44 steps) after checkpoint_every's step-20 checkpoint: the epoch-end report
    (with validation) writes no second checkpoint of that step."""
    metrics, reporter = train_locally(TrainConfig(**FAST, max_steps=20, checkpoint_every=10), tmp_path)
    steps = [torch.load(c / "state.pt", weights_only=True)["position"]["step"] for c in reporter.checkpoints]
    assert steps == [10, 20] and "val_acc" in metrics


def test_stop_after_epochs_then_resume(tmp_path):
    cfg = TrainConfig(**FAST, epochs=3)
    _, whole = train_locally(cfg, tmp_path / "whole")
    part_metrics, part = train_locally(cfg.model_copy(update={"stop_after_epochs": 1}), tmp_path / "part")
    assert part_metrics["epoch"] == 1
    _, rest = train_locally(cfg, tmp_path / "rest", resume=part.checkpoints[-1])
    assert max_abs_diff(final_weights(whole.checkpoints[-1]), final_weights(rest.checkpoints[-1])) == 0.0


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_learns(precision):
    metrics, reporter = train_locally(TrainConfig(**FAST, epochs=2, precision=precision))
    assert metrics["val_acc"] > 0.8
    assert all(math.isfinite(r["loss"]) for r in reporter.rows if "loss" in r)


def test_gpt_char_learns_stdlib_text():
    cfg = TrainConfig(model="gpt-char", seq_len=64, batch_size=16, max_steps=40, log_every=10, lr=3e-3)
    metrics, reporter = train_locally(cfg)
    first = reporter.rows[0]["loss"]
    assert first < math.log(256) + 0.5  # starts near uniform over bytes
    assert metrics["val_loss"] < first - 0.6  # and learns real structure within 40 steps
    assert reporter.rows[0]["tokens_per_s"] == pytest.approx(reporter.rows[0]["samples_per_s"] * 64)


def test_llama_toy_learns_stdlib_text_and_has_llamas_parts():
    cfg = TrainConfig(model="llama-toy", seq_len=64, batch_size=16, max_steps=40, log_every=10, lr=3e-3)
    metrics, reporter = train_locally(cfg)
    first = reporter.rows[0]["loss"]
    assert first < math.log(256) + 0.5 and metrics["val_loss"] < first - 0.6
    model = build_model("llama-toy", DataMeta(kind="tokens", num_classes=256, seq_len=64), cfg)
    attn = model.blocks[0].attn
    assert attn.wkv.out_features == 2 * 2 * 32 and attn.wq.out_features == 4 * 32  # 2 KV heads for 4 query heads
    assert isinstance(model.norm, torch.nn.RMSNorm) and model.output.weight is not model.tok.weight


def test_resnet18_on_fake_images_runs():
    cfg = TrainConfig(model="resnet18", image_size=32, fake_samples=64, batch_size=8, max_steps=2, log_every=1)
    metrics, reporter = train_locally(cfg)
    assert len(reporter.rows) == 3 and math.isfinite(metrics["val_loss"])


def _digits_parquet(path):
    images, labels = digits_tensors()
    encoded = []
    for img in images:
        buf = io.BytesIO()
        Image.fromarray((img[0] * 255).round().byte().numpy(), mode="L").save(buf, format="PNG")
        encoded.append(buf.getvalue())
    pq.write_table(pa.table({"image": encoded, "label": labels.numpy()}), path)


def test_parquet_images_train(tmp_path):
    _digits_parquet(tmp_path / "digits.parquet")
    cfg = TrainConfig(**FAST, dataset="parquet", data_path=str(tmp_path / "digits.parquet"), epochs=3)
    metrics, _ = train_locally(cfg)
    assert metrics["val_acc"] > 0.9


def test_parquet_tokens_train(tmp_path):
    rows = torch.arange(0, 65 * 200).remainder(7).view(200, 65)  # a periodic sequence: learnable exactly
    pq.write_table(pa.table({"tokens": rows.tolist()}), tmp_path / "tok.parquet")
    cfg = TrainConfig(model="gpt-char", dataset="parquet", data_path=str(tmp_path / "tok.parquet"),
                      batch_size=16, max_steps=30, lr=3e-3)
    metrics, _ = train_locally(cfg)
    assert metrics["val_acc"] > 0.9


def test_unwrap_sees_through_a_wrapped_compiled_model():
    # DDP(torch.compile(model)): a compiled module's truth value calls len() on the model, which a plain
    # nn.Module does not have; unwrap must not ask for it (it did, and --compile with 2 workers failed).
    from torch import nn

    from trainables.models.digits_cnn import DigitsCNN
    from trainables.parallel import unwrap

    class Wrapper(nn.Module):  # DDP and DataParallel keep the model in .module
        def __init__(self, module: nn.Module) -> None:
            super().__init__()
            self.module = module

    model = DigitsCNN(1, 10, 8)
    assert unwrap(Wrapper(torch.compile(model))) is model


def test_profile_steps_writes_a_trace_of_those_steps(tmp_path):
    import json

    train_locally(TrainConfig(**FAST, max_steps=6, profile_steps="3-4"), tmp_path)
    trace = json.loads((tmp_path / "profile" / "trace-rank0-steps3-4.json").read_text())
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any("conv2d" in name for name in names)  # the model's own ops were recorded
    assert any(name.startswith("Optimizer.step") for name in names)


def test_uint8_images_are_scaled_on_the_device():
    from trainables.context import DistContext
    from trainables.objective import to_device

    x = torch.tensor([[[[0, 255], [51, 102]]]], dtype=torch.uint8)
    scaled, _ = to_device(x, torch.tensor([1]), DistContext(), TrainConfig(channels_last=True))
    assert scaled.dtype == torch.float32 and scaled.is_contiguous(memory_format=torch.channels_last)
    assert scaled.flatten().tolist() == pytest.approx([0.0, 1.0, 0.2, 0.4])


def test_throughput_rows_leave_out_validation_and_checkpoint_time(tmp_path, monkeypatch):
    """A row whose window spans an epoch's end (validation, a checkpoint) reports the rate of its training steps
    alone; the time set aside is in its own columns. The rate's arithmetic runs on a clock the test moves, so no
    CPU's speed decides it."""
    from types import SimpleNamespace

    from trainables import loop
    from trainables.context import DistContext

    cfg = TrainConfig(epochs=3, log_every=5, val_fraction=0.5, batch_size=32)
    _, reporter = train_locally(cfg, tmp_path)
    train = [r for r in reporter.rows if r.get("val_loss") is None]
    spanning = [r for r in train if "val_time_s" in r]
    assert len(spanning) == 2 and all(r["val_time_s"] > 0 and r["checkpoint_time_s"] > 0 for r in spanning)

    now = [100.0]
    monkeypatch.setattr(loop.time, "perf_counter", lambda: now[0])
    meter = loop.Meter(DistContext(), samples_per_step=32, tokens_per_sample=0)
    state = SimpleNamespace(position=SimpleNamespace(step=5, epoch=0, batch_in_epoch=5),
                            optimizer=SimpleNamespace(param_groups=[{"lr": 0.1}]))
    for _ in range(5):  # five steps of 0.5 s each ...
        meter.add(torch.tensor(1.0))
        now[0] += 0.5
    with meter.set_aside("val_time_s"):  # ... then 7 s of validation and 3 s of checkpoint
        now[0] += 7.0
    with meter.set_aside("checkpoint_time_s"):
        now[0] += 3.0
    row = meter.row(state, micro_per_epoch=10)
    assert row["samples_per_s"] == pytest.approx(5 * 32 / 2.5)
    assert row["val_time_s"] == pytest.approx(7.0) and row["checkpoint_time_s"] == pytest.approx(3.0)
    meter.add(torch.tensor(1.0))
    now[0] += 1.0
    assert "val_time_s" not in meter.row(state, micro_per_epoch=10)  # the next window starts with nothing aside


def _grads_and_op_counts(mode: str) -> tuple[dict[str, torch.Tensor], Counter]:
    """Llama-toy's gradients after one forward and backward with activation checkpointing `mode`, and how many
    times each matmul and attention op ran in all (forward, recomputation, backward)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from trainables.parallel.blocks import checkpoint_activations

    class CountOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.counts: Counter = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            self.counts[func.__name__] += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = build_model("llama-toy", DataMeta(kind="tokens", num_classes=64, seq_len=32))
    checkpoint_activations(model, mode)
    idx = torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(1))
    with CountOps() as ops:
        torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
    return {name: p.grad for name, p in model.named_parameters()}, ops.counts


def test_per_op_checkpointing_recomputes_the_cheap_ops_only():
    plain, ran = _grads_and_op_counts("none")
    per_op, ran_op = _grads_and_op_counts("op")
    full, ran_full = _grads_and_op_counts("full")
    assert max_abs_diff(plain, per_op) == 0 and max_abs_diff(plain, full) == 0  # the same arithmetic, again
    # llama-toy: 4 blocks of 5 matmuls (wq, wkv, wo, w13, w2). Recomputation stops once backward has what it
    # needs, which is never a block's last output: full recomputes 4 matmuls a block and attention, op neither.
    blocks, attention = 4, "_scaled_dot_product_flash_attention_for_cpu.default"
    assert ran_full["mm.default"] - ran["mm.default"] == 4 * blocks and ran_full[attention] == 2 * ran[attention]
    assert ran_op["mm.default"] == ran["mm.default"] and ran_op[attention] == ran[attention]
    # both recompute each block's two RMSNorms (an rsqrt each) and SwiGLU's activation (a silu)
    for cheap, per_block in (("rsqrt.default", 2), ("silu.default", 1)):
        assert ran_op[cheap] - ran[cheap] == ran_full[cheap] - ran[cheap] == per_block * blocks
