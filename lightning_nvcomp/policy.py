"""Deprecated since 0.2, removed in 0.3: ``lightning_nvcomp.policy`` is :mod:`lightning_nvcomp.auto` now (the model:
:mod:`lightning_nvcomp.auto.prediction`)."""

import warnings

from lightning_nvcomp.auto import CodecPolicy
from lightning_nvcomp.auto.prediction import Prediction, choose, predict

warnings.warn(
    "lightning_nvcomp.policy is deprecated: import CodecPolicy from lightning_nvcomp.auto, and Prediction, predict "
    "and choose from lightning_nvcomp.auto.prediction",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["CodecPolicy", "Prediction", "choose", "predict"]
