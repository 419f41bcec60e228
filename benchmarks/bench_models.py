"""The models `make bench` measures, built with onnx.helper or read from disk."""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPSET = 13


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr, np.float32), name)


def _model(nodes, inits, in_shape, n_out, name):
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n_out])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])


def _uniform(rng, fan_in, *shape):
    """PyTorch's default Linear/Conv initialisation: uniform in +-1/sqrt(fan_in)."""
    bound = 1.0 / np.sqrt(fan_in)
    return rng.uniform(-bound, bound, shape)


def linear(n_in=1, n_out=2, seed=0):
    """One Gemm: what a step call costs with next to no arithmetic."""
    rng = np.random.default_rng(seed)
    inits = [_init("fc.weight", _uniform(rng, n_in, n_out, n_in)), _init("fc.bias", _uniform(rng, n_in, n_out))]
    nodes = [helper.make_node("Gemm", ["x", "fc.weight", "fc.bias"], ["y"], transB=1, name="fc")]
    return _model(nodes, inits, [1, n_in], n_out, "linear")


def mlp(n_in=64, hidden=32, n_out=10, seed=0):
    """x (1, 64) -> Gemm 64->32 -> Relu -> Gemm 32->10."""
    rng = np.random.default_rng(seed)
    inits = [_init("fc1.weight", _uniform(rng, n_in, hidden, n_in)), _init("fc1.bias", _uniform(rng, n_in, hidden)),
             _init("fc2.weight", _uniform(rng, hidden, n_out, hidden)),
             _init("fc2.bias", _uniform(rng, hidden, n_out))]
    nodes = [helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1, name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "fc2.weight", "fc2.bias"], ["y"], transB=1, name="fc2")]
    return _model(nodes, inits, [1, n_in], n_out, "mlp")


def small_cnn(seed=0, hw=16, c1=8, c2=16, n_out=10, c_in=1):
    """x (1, c_in=1, 16, 16) -> Conv 3x3 c_in->8 pad 1 -> Relu -> MaxPool 2 -> Conv 3x3 8->16 pad 1 -> Relu
    -> GlobalAveragePool -> Flatten -> Gemm 16->10."""
    rng = np.random.default_rng(seed)
    inits = [_init("c1.weight", _uniform(rng, 9 * c_in, c1, c_in, 3, 3)),
             _init("c1.bias", _uniform(rng, 9 * c_in, c1)),
             _init("c2.weight", _uniform(rng, 9 * c1, c2, c1, 3, 3)), _init("c2.bias", _uniform(rng, 9 * c1, c2)),
             _init("fc.weight", _uniform(rng, c2, n_out, c2)), _init("fc.bias", _uniform(rng, c2, n_out))]
    nodes = [helper.make_node("Conv", ["x", "c1.weight", "c1.bias"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              name="c1"),
             helper.make_node("Relu", ["a"], ["ar"], name="r1"),
             helper.make_node("MaxPool", ["ar"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Conv", ["p", "c2.weight", "c2.bias"], ["b"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              name="c2"),
             helper.make_node("Relu", ["b"], ["br"], name="r2"),
             helper.make_node("GlobalAveragePool", ["br"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["y"], transB=1, name="fc")]
    return _model(nodes, inits, [1, c_in, hw, hw], n_out, "small_cnn")


def tte_dir():
    """MIT's networks: $MICROTRAIN_TTE, else shared/models/tte beside the checkout or a folder
    above it (microtrain/thirdparty.py). None if absent."""
    from microtrain import thirdparty
    return thirdparty.tte_dir()


CALIBRATION = 32   # calibration images for the int8 plans (benchmarks/tte.py's default)
INT8_MCUNET = "MCUNet-5fps 128x128 int8"   # frozen part int8, uint8 input; what trains stays float32


def cases():
    """(id, model name, update, ONNX model or path, has a plain-MicroPython baseline, compile options).
    Every case uses cross-entropy, SGD momentum 0.9 and batch 1. Compile options (None for a float32
    plan of the whole model): "int8" = number of calibration images (benchmarks/calibration.py) for
    an int8 frozen part taking uint8 pixels, as benchmarks/tte.py compiles MIT's networks; the rest
    go to microtrain.compile as they are (update= then replaces the update label)."""
    out = [("fixed", "Linear 1-2 (fixed cost)", "full", linear(), False, None),
           ("mlp-full", "MLP 64-32-10", "full", mlp(), True, None),
           ("mlp-last", "MLP 64-32-10", "last-layer", mlp(), True, None),
           ("cnn-full", "small CNN 16x16", "full", small_cnn(), False, None),
           ("cnn-last", "small CNN 16x16", "last-layer", small_cnn(), False, None),
           ("digits-last", "digits CNN (example)", "last-layer", os.path.join(ROOT, "examples", "digits_cnn.onnx"),
            False, None)]
    tte = tte_dir()
    onnx_path, schemes = (os.path.join(tte or "", "mcunet-5fps" + ext) for ext in (".onnx", ".schemes.json"))
    if tte and os.path.exists(onnx_path):
        out.append(("mcunet-last", "MCUNet-5fps 128x128", "last-layer", onnx_path, False, None))
        out.append(("mcunet-int8-last", INT8_MCUNET, "last-layer", onnx_path, False, dict(int8=CALIBRATION)))
        if os.path.exists(schemes):
            out.append(("mcunet-int8-49kb", INT8_MCUNET, "sparse 49kb (MIT)", onnx_path, False,
                        dict(int8=CALIBRATION, update=schemes, scheme="49kb", saved="bits")))
    return out


def load(model):
    return onnx.load(model) if isinstance(model, str) else model
