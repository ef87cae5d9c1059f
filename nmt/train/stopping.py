"""Which validation is the best so far, by one metric, and when to stop trying.

The same rule picks `model.pt` and ends the run: validation perplexity (lower is better) or
validation BLEU (higher is better), `train.early_stopping_metric`. Only a strict improvement
counts; with patience P > 0 (`train.early_stopping`) the run stops after P validations in a
row without one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

METRICS = {"ppl": "perplexity", "bleu": "BLEU"}


@dataclass
class EarlyStopping:
    metric: str  # "ppl" or "bleu"
    patience: int  # 0: never stop
    best: float = math.nan  # the best value so far (nan: no validation yet)
    best_step: int = -1
    bad: int = 0  # validations since the best

    @property
    def name(self) -> str:
        return METRICS[self.metric]

    def improves(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if math.isnan(self.best):
            return True
        return value < self.best if self.metric == "ppl" else value > self.best

    def update(self, value: float, step: int) -> bool:
        """Record one validation's value; True when it is the new best."""
        if self.improves(value):
            self.best, self.best_step, self.bad = value, step, 0
            return True
        self.bad += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.bad >= self.patience

    def state_dict(self) -> dict:
        return {
            "metric": self.metric,
            "best": self.best,
            "best_step": self.best_step,
            "bad": self.bad,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the counts; a run resumed with another metric starts its choice afresh."""
        if state.get("metric") != self.metric:
            return
        self.best = float(state["best"])
        self.best_step = int(state["best_step"])
        self.bad = int(state["bad"])
