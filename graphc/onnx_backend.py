"""graphc as an ONNX backend (`onnx.backend.base`), the API ONNX's own backend tests drive.

    import graphc.onnx_backend as backend
    rep = backend.prepare(model, device="CPU")
    outputs = rep.run([x])            # or rep.run({"x": x}); outputs[0] or outputs["y"]

Like ONNX Runtime's backend module, this module exposes `prepare`, `run_model`, `run_node`,
`supports_device` and `is_compatible`. Each device has a runner: "CPU" runs graphc's reference
interpreter. A CUDA runner (compile, then run the engine) plugs in through `_RUNNERS`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from graphc.errors import GraphcError, InputError
from graphc.ir.graph import Graph

log = logging.getLogger(__name__)

Feeds = Mapping[str, Any]
Runner = Callable[[Graph, Feeds], Mapping[str, Any]]


def _run_interpreter(graph: Graph, feeds: Feeds) -> Mapping[str, Any]:
    from graphc.interpreter import interpret

    return interpret(graph, feeds)


# Device type -> how a prepared graph runs there. Add DeviceType.CUDA here when the CUDA
# executor lands; `supports_device` follows this table.
_RUNNERS: dict[Any, Runner] = {DeviceType.CPU: _run_interpreter}


def _device_type(device: str) -> Any:
    try:
        return Device(device).type
    except (AttributeError, ValueError):
        raise GraphcError(f"unknown device {device!r} (devices look like 'CPU', 'CUDA' or 'CUDA:1')") from None


class GraphcRep(BackendRep):
    """A model prepared for repeated runs on one device."""

    def __init__(self, graph: Graph, device: str = "CPU", opt_level: int = 0):
        self.graph = graph
        self.device = device
        self.opt_level = opt_level
        self._optimized: dict[tuple, Graph] = {}
        self._runner = _RUNNERS[_device_type(device)]
        self.input_names = [v.name for v in graph.inputs]
        self.output_names = list(graph.output_names)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run on `inputs`: a list in graph-input order, a dict by input name, or a single array
        when the graph takes one input. Returns the outputs in graph-output order, as a tuple
        that also answers to output names (`outputs["y"]`)."""
        feeds = self._feeds(inputs)
        results = self._runner(self._graph_for(feeds), feeds)
        outputs = namedtupledict("Outputs", self.output_names)
        return outputs(*(results[name] for name in self.output_names))

    def _graph_for(self, feeds: Mapping[str, Any]) -> Graph:
        """The graph to run: as loaded, or (opt_level > 0) bound to these input shapes and
        optimized, once per set of shapes. A graph whose shapes depend on run-time values cannot be
        bound; it runs unoptimized, and the log says so."""
        if self.opt_level <= 0:
            return self.graph
        key = tuple((k, tuple(np.shape(v))) for k, v in sorted(feeds.items()) if isinstance(v, np.ndarray))
        if key not in self._optimized:
            from graphc.errors import ShapeError
            from graphc.ir.shapes import bind_shapes
            from graphc.passes import OptimizeOptions, optimize

            try:
                bound = bind_shapes(self.graph, {k: s for k, s in key})
                self._optimized[key] = optimize(bound, OptimizeOptions(opt_level=self.opt_level, verify=True)).graph
            except ShapeError as e:
                log.info("running '%s' unoptimized: %s", self.graph.name, e)
                self._optimized[key] = self.graph
        return self._optimized[key]

    def _feeds(self, inputs: Any) -> dict[str, Any]:
        if isinstance(inputs, Mapping):
            return {k: _as_feed(v) for k, v in inputs.items()}
        if isinstance(inputs, (list, tuple)):
            if len(inputs) != len(self.input_names):
                raise InputError(
                    f"{len(inputs)} inputs given, the graph takes {len(self.input_names)}: {self.input_names}"
                )
            return {n: _as_feed(v) for n, v in zip(self.input_names, inputs, strict=True)}
        if len(self.input_names) != 1:
            raise InputError(f"a single input given, the graph takes {len(self.input_names)}: {self.input_names}")
        return {self.input_names[0]: _as_feed(inputs)}


def _as_feed(x: Any) -> Any:
    """Numpy scalars as 0-d arrays; sequences (lists of arrays) stay lists; None (an empty
    optional) stays None."""
    if x is None:
        return None
    if isinstance(x, list):
        return [np.asarray(e) for e in x]
    return np.asarray(x)


class GraphcBackend(Backend):
    @classmethod
    def is_compatible(cls, model: Any, device: str = "CPU", **kwargs: Any) -> bool:
        """Whether graphc can run the model on `device`: a valid model whose ops are all supported."""
        from graphc.frontend import find_unsupported, read_model

        if not cls.supports_device(device):
            return False
        try:
            proto, _ = read_model(model)
            return not find_unsupported(proto)
        except GraphcError:
            return False

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> GraphcRep:
        """Load `model` (a ModelProto, bytes or path; a GraphcRep is returned as it is) for `device`.

        Raises UnsupportedOpError (listing every unsupported op), ModelLoadError or ShapeError
        as `graphc.load_onnx` does; GraphcError for a device graphc cannot run on.
        """
        from graphc.frontend import load_onnx

        if isinstance(model, GraphcRep) and model.device == device:
            return model
        if not cls.supports_device(device):
            raise GraphcError(
                f"graphc's ONNX backend cannot run on device {device!r} (supported: {', '.join(_device_names())})"
            )
        graph = load_onnx(model)
        return GraphcRep(graph, device, opt_level=int(kwargs.get("opt_level", 0)))

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run one node on `inputs` (a list in the node's input order, or a dict by input name).

        The node is wrapped in a model at `opset_version` (default: the newest ONNX opset).
        """
        model = node_model(node, inputs, outputs_info, opset_version=kwargs.get("opset_version"))
        if isinstance(inputs, Mapping):
            feeds: Any = dict(inputs)
        else:
            present = [n for n in node.input if n]
            feeds = dict(zip(present, list(inputs), strict=False))
        return cls.run_model(model, feeds, device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return _device_type(device) in _RUNNERS
        except GraphcError:
            return False


def _device_names() -> list[str]:
    names = {v: k for k, v in vars(DeviceType).items() if not k.startswith("_")}
    return [names.get(t, str(t)) for t in _RUNNERS]


def node_model(
    node: onnx.NodeProto,
    inputs: Any,
    outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
    *,
    opset_version: int | None = None,
) -> onnx.ModelProto:
    """A model of one node whose graph inputs are typed from the given input arrays."""
    present = [n for n in node.input if n]
    if isinstance(inputs, Mapping):
        arrays = [inputs[n] for n in present]
    else:
        arrays = list(inputs)
        if len(arrays) != len(present):
            raise InputError(f"{len(arrays)} inputs given, node {node.op_type} takes {len(present)}")
    graph_inputs = [_value_info(n, x) for n, x in zip(present, arrays, strict=True)]
    graph_outputs = []
    for i, name in enumerate(n for n in node.output if n):
        if outputs_info is not None and i < len(outputs_info):
            dtype, shape = outputs_info[i]
            elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
            graph_outputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        else:
            graph_outputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None))
    graph = helper.make_graph([node], f"{node.op_type}_node", graph_inputs, graph_outputs)
    domain = node.domain if node.domain != "ai.onnx" else ""
    version = opset_version or (onnx.defs.onnx_opset_version() if domain == "" else 1)
    opsets = [helper.make_opsetid(domain, version)]
    if domain != "":
        opsets.append(helper.make_opsetid("", onnx.defs.onnx_opset_version()))
    model = helper.make_model(graph, opset_imports=opsets)
    # The checker wants typed graph outputs: let ONNX infer those not given. A failure is left
    # to the loader, which reports the model's problem.
    with contextlib.suppress(Exception):
        model = onnx.shape_inference.infer_shapes(model)
    return model


def _value_info(name: str, x: Any) -> onnx.ValueInfoProto:
    if isinstance(x, list):
        elem = np.asarray(x[0]) if x else np.zeros(0, np.float32)
        seq = helper.make_sequence_type_proto(
            helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(elem.dtype), None)
        )
        return helper.make_value_info(name, seq)
    arr = np.asarray(x)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape))


is_compatible = GraphcBackend.is_compatible
prepare = GraphcBackend.prepare
run_model = GraphcBackend.run_model
run = GraphcBackend.run_model  # the name ONNX Runtime's backend module uses
run_node = GraphcBackend.run_node
supports_device = GraphcBackend.supports_device
