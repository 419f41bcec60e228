"""microtrain: train neural networks on microcontrollers.

compile() turns an ONNX model into a training plan; Simulator runs that plan
on the host with the same C core the firmware runs.
"""
from .version import __version__  # noqa: F401
from .api import compile  # noqa: F401  (shadows the builtin on purpose: microtrain.compile)
from .options import CompileOptions  # noqa: F401
from .plan import Plan, load_plan  # noqa: F401
from .simulator import Simulator  # noqa: F401
from .native import PlanError  # noqa: F401
from .unfold import state_dict  # noqa: F401
