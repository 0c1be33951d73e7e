"""What ``codec="auto"`` means: the storage probed (:mod:`.probe`), the codecs calibrated on the state
(:mod:`.calibration`), each codec's save predicted (:mod:`.prediction`) and the one that loses the least training
time chosen, learning from every real save (:mod:`.policy`), counting how much slower training runs while a write
runs behind it (:mod:`.steps`)."""

from lightning_nvcomp.auto.policy import CodecPolicy
from lightning_nvcomp.auto.prediction import Prediction

__all__ = ["CodecPolicy", "Prediction"]
