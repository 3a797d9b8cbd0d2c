"""GPU faults: NVIDIA's catalogue as data (`catalogue`), the condition format the node agent writes
and the reconciler reads (`condition`), and the effective catalogue a spec makes (`policy`)."""
from .catalogue import XIDS, FaultAction, Kind, default_action, describe

__all__ = ["XIDS", "FaultAction", "Kind", "default_action", "describe"]
