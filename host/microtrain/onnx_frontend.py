"""The ONNX front end: a model (a path, bytes or a ModelProto) in, the IR graph out. Float
models go through onnx_import's Importer, int8 QDQ models through qdq_import's QDQImporter,
whose Q/DQ handlers join onnx_import's registry when qdq_import is imported, here: so
onnx_import never imports qdq_import back."""
from . import qdq_import
from .onnx_import import Importer, load_model


def import_onnx(model, loss="cross-entropy"):
    model, notes, fingerprint = load_model(model)
    qdq_import.check_supported_form(model)
    imp = (qdq_import.QDQImporter if qdq_import.is_qdq(model) else Importer)(model, loss)
    graph = imp.run()
    graph.notes[:0] = notes
    graph.fingerprint = fingerprint
    return graph
