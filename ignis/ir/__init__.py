"""The IR: typed SSA graph, op table, printer, verifier and NumPy reference interpreter."""
from .errors import InterpreterInputError, IRBuildError, IRTypeError, IRVerifyError
from .graph import Graph, GraphBuilder, Node, Value
from .ops import OPS, OpDef, infer_type
from .printer import format_graph
from .types import TensorType, f32, i32
from .verify import verify

__all__ = ["Graph", "GraphBuilder", "Node", "Value", "OPS", "OpDef", "infer_type", "format_graph",
           "TensorType", "f32", "i32", "verify", "IRTypeError", "IRVerifyError", "IRBuildError",
           "InterpreterInputError"]
