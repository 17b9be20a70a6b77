"""Your own model, data and loss by import path, in the shared loop: in one process (factories, losses, dict
batches, resume) and through the CLI on real Ray with 2 workers, from the folder the user launches in."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
from conftest import DATA, run_cli
from helpers import final_weights, max_abs_diff

from groundwork.errors import ConfigError
from trainables.config import TrainConfig
from trainables.data.meta import DataMeta
from trainables.local import train_locally
from trainables.models import build_model

BYO = DATA / "byo"
FAST = {"batch_size": 32, "log_every": 5}


@pytest.fixture
def my_code(monkeypatch):
    monkeypatch.syspath_prepend(str(BYO))


def test_factories_get_what_they_declare_and_refuse_in_one_line(my_code):
    meta = DataMeta("image", 10, 3, 32)
    resnet = build_model("torchvision.models:resnet18", meta, user={"num_classes": 7})  # torchvision as it is
    assert resnet.fc.out_features == 7
    assert build_model("my_code:mlp", meta, user={"hidden": 5})[0].out_features == 5
    with pytest.raises(ConfigError, match=r"model 'my_code:needs_width' needs argument 'width': set it with"
                                          r" --set width=VALUE"):
        build_model("my_code:needs_width", meta)
    with pytest.raises(ConfigError, match=r"model 'my_code:not_a_model' returned a str: a model factory returns"):
        build_model("my_code:not_a_model", meta)
    with pytest.raises(ConfigError, match=r"model 'my_code:nope' cannot be loaded"):
        build_model("my_code:nope", meta)


def test_your_model_and_data_learn_and_a_given_loss_is_the_loss(my_code, tmp_path):
    # 5 epochs at lr 1e-2: val_acc 0.947-0.972 over seeds 0-4 (batch 32 and 64)
    cfg = TrainConfig(model="my_code:mlp", dataset="my_code:digits_flat", epochs=5, lr=1e-2, **FAST)
    metrics, run = train_locally(cfg, tmp_path / "mlp", user={"hidden": 48})
    assert metrics["val_acc"] > 0.9
    assert final_weights(run.checkpoints[-1])["0.weight"].shape == (48, 64)
    # --loss with torch's own cross-entropy trains exactly as the built-in one does
    sgd = {"model": "digits-cnn", "optimizer": "sgd", "lr": 0.05, "max_steps": 6, **FAST}
    _, builtin = train_locally(TrainConfig(**sgd), tmp_path / "builtin")
    _, given = train_locally(TrainConfig(**sgd, loss="torch.nn.functional:cross_entropy"), tmp_path / "given")
    assert max_abs_diff(final_weights(builtin.checkpoints[-1]), final_weights(given.checkpoints[-1])) < 1e-6


def test_a_model_with_its_own_loss_on_dict_batches_trains_and_resumes_exactly(my_code, tmp_path):
    cfg = TrainConfig(model="my_code:scoring_mlp", dataset="my_code:dict_digits", epochs=2, lr=1e-2,
                      checkpoint_every=20, **FAST)
    metrics, whole = train_locally(cfg, tmp_path / "whole")
    # from ~2.3 (chance) to 0.26-0.32 over seeds 0-3; no logits/targets pair, so no accuracy
    assert metrics["val_loss"] < 0.6 and "val_acc" not in metrics
    _, resumed = train_locally(cfg, tmp_path / "resumed", resume=whole.checkpoints[0])  # step 20, mid-epoch
    assert max_abs_diff(final_weights(whole.checkpoints[-1]), final_weights(resumed.checkpoints[-1])) == 0.0
    no_loss = TrainConfig(model="my_code:mlp", dataset="my_code:dict_digits", max_steps=1, **FAST)
    with pytest.raises(TypeError):  # mlp() takes no keyword batch: the user's model must accept its batch
        train_locally(no_loss)


def test_your_model_and_data_train_through_the_cli_from_your_folder(ray_local, tmp_path):
    shutil.copy(BYO / "my_code.py", tmp_path)  # the user's own file, in the folder they launch from
    proc = run_cli("launch", "--model", "my_code:mlp", "--dataset", "my_code:digits_flat", "--set", "hidden=48",
                   "--lr", "1e-2", "--workers", "2", "--epochs", "5", "--name", "mine", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "mine"
    rows = pd.read_parquet(run / "metrics.parquet")
    assert rows["val_acc"].dropna().iloc[-1] >= 0.9
    latest = max(p for p in run.glob("checkpoint_*") if p.is_dir())
    assert final_weights(latest)["0.weight"].shape == (48, 64)  # --set reached the factory


@pytest.mark.parametrize("args, expect", [
    (["--model", "my_code:mlp"], "model 'my_code:mlp' is your own: name its data with --dataset"),
    (["--model", "my_code:nope", "--dataset", "digits"], "model 'my_code:nope' cannot be loaded"),
    (["--dataset", "my_code:nope"], "dataset 'my_code:nope' cannot be loaded"),
    (["--loss", "not a path"], "loss: String should match pattern"),
    (["--set", "hidden"], "--set 'hidden': write KEY=VALUE"),
])
def test_bad_user_code_is_refused_before_ray_starts(tmp_path, args, expect):
    shutil.copy(BYO / "my_code.py", tmp_path)
    proc = run_cli("launch", *args, cwd=tmp_path)
    assert proc.returncode == 2 and expect in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my_code.py"]


def test_a_sweep_searches_your_own_settings(ray_local, in_tmp, monkeypatch):
    import orchestrator
    from orchestrator.sweeps.config import SweepConfig

    shutil.copy(BYO / "my_code.py", in_tmp)
    monkeypatch.syspath_prepend(str(in_tmp))
    cfg = {"name": "mine", "metric": "val_acc", "mode": "max", "num_samples": 1, "scheduler": {"type": "fifo"},
           "space": {"user.hidden": {"type": "grid", "values": [4, 48]}},
           "base": {"workers": 2, "train": {"model": "my_code:mlp", "dataset": "my_code:digits_flat", "epochs": 2,
                                            "lr": 1e-2}}}
    result = orchestrator.sweep(SweepConfig.model_validate(cfg), quiet=True)
    trials = pd.read_parquet(result.path / "trials.parquet")
    assert sorted(trials["param_user.hidden"].unique()) == [4, 48]
    assert result.best_config.user == {"hidden": 48}  # 48 hidden units beat 4
    assert (result.path / "sweep.png").exists()
