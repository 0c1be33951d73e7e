"""What saves cost and saved: one save's figures (:mod:`.stats`), the savings a run logs (:mod:`.savings`) against the
uncompressed baseline, a ``torch.save`` with the same durability (:mod:`.baseline`), and the cost model behind
``lightning-nvcomp estimate`` (:mod:`.estimate`, with what a checkpoint holds and the ratios measured on it in
:mod:`.components`)."""

from lightning_nvcomp.telemetry.savings import Savings
from lightning_nvcomp.telemetry.stats import SaveStats

__all__ = ["SaveStats", "Savings"]
