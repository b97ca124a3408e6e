"""The ONNX target: ssmcc-domain nodes with portable function bodies, run in ONNX Runtime."""

from ssmcc.lowering.onnx.emitters import ONNX_TABLE, ONNX_UNSUPPORTED
from ssmcc.lowering.onnx.export import OPSET, lower_to_onnx
from ssmcc.lowering.table import UNSUPPORTED, register_table

register_table("onnx", ONNX_TABLE)
UNSUPPORTED["onnx"] = ONNX_UNSUPPORTED

__all__ = ["ONNX_TABLE", "OPSET", "lower_to_onnx"]
