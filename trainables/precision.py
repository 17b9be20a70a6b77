"""fp32, bf16, fp16 or fp8 mixed precision: an autocast context and a GradScaler that is live only for fp16.
fp8's linear layers are converted by trainables.parallel.float8; around them it runs as bf16."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch

from trainables.config import Precision

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}

log = logging.getLogger(__name__)


@dataclass
class MixedPrecision:
    precision: Precision
    device_type: str
    scaler: torch.amp.GradScaler

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=_DTYPES[self.precision])


def mixed_precision(precision: Precision, device: torch.device) -> MixedPrecision:
    if precision == "fp16" and device.type == "cpu":
        log.warning("fp16 on CPU is slow and numerically poor: bf16 is the CPU's mixed precision")
    # fp16's narrow range underflows small gradients: scale the loss up, unscale before the step.
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    return MixedPrecision(precision, device.type, scaler)
