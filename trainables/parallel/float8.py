"""--precision fp8: torchao's float8 training (PyTorch's own): each large nn.Linear computes its matmuls in
float8 with dynamic scaling (tensorwise or rowwise), the rest of the model in bf16 under autocast. Converted
before the model is compiled or sharded, as torchtitan does."""

from __future__ import annotations

import torch
from torch import nn

from groundwork.errors import ConfigError
from trainables.config import TrainConfig
from trainables.context import DistContext

FLOAT8_CAPABILITY = (8, 9)  # Ada and Hopper have float8 tensor cores


def check_float8(device: torch.device) -> None:
    """Refuse fp8 where the device has no float8 matmul, in one line."""
    if device.type != "cuda":
        raise ConfigError("precision fp8 needs an NVIDIA GPU with float8 (compute capability 8.9+: Ada, Hopper):"
                          " this worker has none: use --precision bf16, or give the workers GPUs")
    capability = torch.cuda.get_device_capability(device)
    if capability < FLOAT8_CAPABILITY:
        raise ConfigError(f"precision fp8 needs compute capability 8.9+ (Ada, Hopper); "
                          f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}: use bf16")


def float8_linears(model: nn.Module, cfg: TrainConfig, ctx: DistContext) -> None:
    """Swap the model's linear layers whose shapes float8 kernels take (both dimensions multiples of 16)."""
    check_float8(ctx.device)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # deferred: fp8 runs only

    def eligible(module: nn.Module, name: str) -> bool:
        return isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0

    convert_to_float8_training(model, module_filter_fn=eligible,
                               config=Float8LinearConfig.from_recipe_name(cfg.fp8_recipe))
