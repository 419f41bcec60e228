"""Small ONNX models built with onnx.helper, shared by the tests (no PyTorch needed)."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr, np.float32), name)


def mlp(n_in=6, hidden=5, n_out=3, seed=0):
    """input (1, n_in) -> Gemm -> Relu -> Gemm."""
    rng = np.random.default_rng(seed)
    inits = [_init("fc1.weight", rng.normal(0, 0.5, (hidden, n_in))), _init("fc1.bias", rng.normal(0, 0.1, hidden)),
             _init("fc2.weight", rng.normal(0, 0.5, (n_out, hidden))), _init("fc2.bias", rng.normal(0, 0.1, n_out))]
    nodes = [helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1, name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "fc2.weight", "fc2.bias"], ["y"], transB=1, name="fc2")]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n_in])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n_out])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])


def cnn(seed=0, hw=8, n_out=4):
    """conv -> relu -> depthwise conv -> clip(0,6) -> add(residual) -> maxpool -> conv1x1 -> relu -> gap -> flatten -> gemm."""
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.normal(0, 0.4, s)   # noqa: E731
    inits = [_init("c1.weight", w(4, 2, 3, 3)), _init("c1.bias", w(4)),
             _init("dw.weight", w(4, 1, 3, 3)), _init("dw.bias", w(4)),
             _init("pw.weight", w(6, 4, 1, 1)), _init("pw.bias", w(6)),
             _init("fc.weight", w(n_out, 6)), _init("fc.bias", w(n_out)),
             _init("lo", 0.0), _init("hi", 6.0)]
    nodes = [helper.make_node("Conv", ["x", "c1.weight", "c1.bias"], ["a"], pads=[1, 1, 1, 1], name="c1"),
             helper.make_node("Relu", ["a"], ["a_r"], name="r1"),
             helper.make_node("Conv", ["a_r", "dw.weight", "dw.bias"], ["b"], pads=[1, 1, 1, 1], group=4, name="dw"),
             helper.make_node("Clip", ["b", "lo", "hi"], ["b_r"], name="relu6"),
             helper.make_node("Add", ["a_r", "b_r"], ["s"], name="res"),
             helper.make_node("MaxPool", ["s"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Conv", ["p", "pw.weight", "pw.bias"], ["c"], name="pw"),
             helper.make_node("Relu", ["c"], ["c_r"], name="r3"),
             helper.make_node("GlobalAveragePool", ["c_r"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["y"], transB=1, name="fc")]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n_out])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])


def conv_view_conv(view=True, seed=11):
    """conv -> Reshape to its own shape (a view, as exporters emit) -> 1x1 conv -> GAP -> flatten;
    view=False: the same without the Reshape. SPLIT_VIEW_SCHEME trains the second conv on input
    channels 1 and 3 (split.py), so the gradient reaching the view joins the frozen part's."""
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.normal(0, 0.5, s)   # noqa: E731
    inits = [_init("c.weight", w(4, 2, 3, 3)), _init("c.bias", w(4)), _init("p.weight", w(3, 4, 1, 1)),
             _init("p.bias", w(3))]
    nodes = [helper.make_node("Conv", ["x", "c.weight", "c.bias"], ["a"], pads=[1, 1, 1, 1], name="c")]
    if view:
        inits.append(numpy_helper.from_array(np.array([1, 4, 4, 4], np.int64), "shape"))
        nodes.append(helper.make_node("Reshape", ["a", "shape"], ["v"], name="view"))
    nodes += [helper.make_node("Conv", ["v" if view else "a", "p.weight", "p.bias"], ["b"], name="p"),
              helper.make_node("GlobalAveragePool", ["b"], ["g"], name="gap"),
              helper.make_node("Flatten", ["g"], ["y"], name="flat")]
    g = helper.make_graph(nodes, "conv_view_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])


SPLIT_VIEW_SCHEME = {"classifier": "none", "bias_updates": [{"initializer": "c.bias"}, {"initializer": "p.bias"}],
                     "weight_updates": [{"initializer": "p.weight", "channel_axis": 1, "selected_channels": [1, 3]}]}


def with_node(model, node):
    """A copy of model with an extra node spliced in before the output (for unsupported-op tests)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    out = m.graph.output[0].name
    last = m.graph.node[-1]
    last.output[0] = out + "_pre"
    node.input[0] = out + "_pre"
    node.output[0] = out
    m.graph.node.append(node)
    return m
