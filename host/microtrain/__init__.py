"""microtrain: train neural networks on microcontrollers.

compile() turns an ONNX model into a training plan; Simulator runs that plan
on the host with the same C core the firmware runs.
"""
__version__ = "0.1.0"

from .compiler import compile  # noqa: E402,F401  (shadows the builtin on purpose: microtrain.compile)
from .plan import Plan, load_plan  # noqa: E402,F401
from .simulator import Simulator  # noqa: E402,F401
from .native import PlanError  # noqa: E402,F401
