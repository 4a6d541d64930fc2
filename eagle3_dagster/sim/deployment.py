"""A changed deployment, as the simulator can emulate it: a new weight version and shorter reasoning.

Real nightly regenerations meet deployments that changed under them: new weights pushed with
`--weight-version` (SGLang reports it as `weight_version` in /model_info and in every
`meta_info`), a quantized model, or a server flag that caps thinking. Rows stay well-formed, so
only a comparison across nights notices. `eagle3-sim --weight-version v2 --reasoning-scale 0.2`
serves such a deployment: the same prompts get the same answers and tool calls, but each
reasoning passage keeps only about `reasoning_scale` of its words (at least one), so reasoning is
about 1/scale times shorter. Scale 1.0 and version "default" are the unchanged deployment and
leave every output byte-identical to a simulator started without these flags.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Deployment:
    weight_version: str = "default"
    reasoning_scale: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.reasoning_scale <= 1.0:
            raise ValueError(f"--reasoning-scale must be in (0, 1], got {self.reasoning_scale}")
        if not self.weight_version.strip():
            raise ValueError("--weight-version must not be empty")

    @property
    def changed(self) -> bool:
        return self.weight_version != "default" or self.reasoning_scale != 1.0

    def shape_reasoning(self, reasoning: str) -> str:
        """The reasoning text this deployment produces in place of the default one."""
        if self.reasoning_scale == 1.0:
            return reasoning
        words = reasoning.split(" ")
        keep = max(1, math.ceil(len(words) * self.reasoning_scale))
        out = " ".join(words[:keep]).rstrip(".,;: ")
        return out + "."
