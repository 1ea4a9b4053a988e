"""What `/openapi.json` says about the verbs: request and response bodies from the wire models.

The verb routes are plain ASGI endpoints reading raw bytes (extender.app), so FastAPI alone would
publish nothing about them: `verb_paths` describes each, its request and response bodies generated
from gpupack.extender.wire; the handlers still parse the bytes themselves. ExtenderArgs keeps the Pod as a
plain dict on the wire, so its schema is replaced by `PodFields`: the part of a v1.Pod gpupack reads
(metadata, containers' resources, node selection), everything else allowed. Nothing here is used to
parse a request.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import JsonSchemaMode

from gpupack.extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
)
from gpupack.kube.keys import RESOURCE_CPU, RESOURCE_GPU, RESOURCE_GPU_MILLI, RESOURCE_MEMORY, RESOURCE_MIG_PREFIX

JSON = "application/json"
Quantity = str | int


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ResourceList(_Open):
    """Container limits or requests: the resources gpupack counts (others are allowed and ignored)."""

    cpu: Quantity | None = Field(None, alias=RESOURCE_CPU)
    memory: Quantity | None = Field(None, alias=RESOURCE_MEMORY)
    gpu: Quantity | None = Field(None, alias=RESOURCE_GPU)
    gpu_milli: Quantity | None = Field(None, alias=RESOURCE_GPU_MILLI)
    mig_1g: Quantity | None = Field(None, alias=f"{RESOURCE_MIG_PREFIX}1g.10gb")
    mig_3g: Quantity | None = Field(None, alias=f"{RESOURCE_MIG_PREFIX}3g.40gb")


class Resources(_Open):
    """v1.ResourceRequirements."""

    limits: ResourceList | None = None
    requests: ResourceList | None = None


class Container(_Open):
    """v1.Container: its name and resources."""

    name: str
    resources: Resources | None = None


class PodMetadata(_Open):
    """v1.ObjectMeta of the pod."""

    name: str = Field(min_length=1)
    namespace: str | None = None
    uid: str | None = None
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None


class PodSpec(_Open):
    """v1.PodSpec: containers and the node-selection fields gpupack reads."""

    containers: list[Container] = Field(default_factory=list)
    init_containers: list[Container] | None = Field(None, alias="initContainers")
    node_selector: dict[str, str] | None = Field(None, alias="nodeSelector")
    node_name: str | None = Field(None, alias="nodeName")
    overhead: ResourceList | None = None
    scheduler_name: str | None = Field(None, alias="schedulerName")


class PodFields(_Open):
    """The part of a v1.Pod gpupack reads; the scheduler sends the whole object."""

    metadata: PodMetadata
    spec: PodSpec | None = None


class NodeMetadata(_Open):
    """v1.ObjectMeta of a candidate Node: gpupack reads its name only."""

    name: str = Field(min_length=1)


class NodeItem(_Open):
    """A candidate v1.Node in `Nodes` mode (its facts come from gpupack's own watch, not from here)."""

    metadata: NodeMetadata


class NodeItems(_Open):
    """v1.NodeList as kube-scheduler sends it."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    items: list[NodeItem] = Field(default_factory=list)


class ErrorBody(BaseModel):
    """`{"Error": reason}`: a refused request (400, 408, 413)."""

    error: str = Field(alias="Error")


def schema_of(model: type[BaseModel], mode: JsonSchemaMode = "validation") -> dict[str, Any]:
    """The model's JSON schema by alias, with every `$ref` inlined (no shared components needed)."""
    schema = model.model_json_schema(by_alias=True, mode=mode)
    definitions = schema.pop("$defs", {})
    return _inline(schema, definitions)


def _inline(node: Any, definitions: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(definitions[ref.removeprefix("#/$defs/")], definitions)
        return {key: _inline(value, definitions) for key, value in node.items()}
    if isinstance(node, list):
        return [_inline(item, definitions) for item in node]
    return node


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {JSON: {"schema": schema}}}


def _answer(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def _refusals() -> dict[str, Any]:
    error = schema_of(ErrorBody)
    return {
        "400": _answer("a body kube-scheduler would never send", error),
        "408": _answer("the body did not arrive within verbTimeoutSeconds", error),
        "413": _answer("the body exceeds maxBodyBytes", error),
    }


def extender_args_operation(answer: dict[str, Any], description: str) -> dict[str, Any]:
    """The operation of filter/prioritize: ExtenderArgs in (Pod and Nodes described), `answer` out.

    kube-scheduler always sends all three keys, and exactly one of `Nodes` / `NodeNames` is non-null.
    """
    schema = schema_of(ExtenderArgs)
    schema["properties"]["Pod"] = schema_of(PodFields)
    schema["properties"]["Nodes"] = {"anyOf": [schema_of(NodeItems), {"type": "null"}]}
    schema["required"] = ["Pod", "Nodes", "NodeNames"]
    schema["oneOf"] = [
        {"properties": {"Nodes": {"type": "null"}, "NodeNames": {"type": "array"}}},
        {"properties": {"Nodes": {"type": "object"}, "NodeNames": {"type": "null"}}},
    ]
    return {"requestBody": _body(schema), "responses": {"200": _answer(description, answer), **_refusals()}}


def filter_operation() -> dict[str, Any]:
    """The operation of `POST /filter`."""
    return extender_args_operation(schema_of(ExtenderFilterResult, "serialization"), "ExtenderFilterResult")


def prioritize_operation() -> dict[str, Any]:
    """The operation of `POST /prioritize`."""
    answer = {"type": "array", "items": schema_of(HostPriority, "serialization")}
    return extender_args_operation(answer, "HostPriorityList")


def bind_operation() -> dict[str, Any]:
    """The operation of `POST /bind`."""
    return {
        "requestBody": _body(schema_of(ExtenderBindingArgs)),
        "responses": {
            "200": _answer("ExtenderBindingResult", schema_of(ExtenderBindingResult, "serialization")),
            **_refusals(),
        },
    }


def preempt_operation() -> dict[str, Any]:
    """The operation of `POST /preempt`: exactly one of the two victim maps is non-null (#28)."""
    schema = schema_of(ExtenderPreemptionArgs)
    schema["properties"]["Pod"] = schema_of(PodFields)
    schema["required"] = ["Pod"]
    schema["oneOf"] = [
        {"properties": {"NodeNameToVictims": {"type": "null"}, "NodeNameToMetaVictims": {"type": "object"}}},
        {"properties": {"NodeNameToVictims": {"type": "object"}, "NodeNameToMetaVictims": {"type": "null"}}},
    ]
    return {
        "requestBody": _body(schema),
        "responses": {
            "200": _answer("ExtenderPreemptionResult", schema_of(ExtenderPreemptionResult, "serialization")),
            **_refusals(),
        },
    }


def verb_paths() -> dict[str, Any]:
    """The OpenAPI paths of `POST /filter`, `/prioritize`, `/preempt` and `/bind`."""
    operations = {
        "filter": filter_operation(),
        "prioritize": prioritize_operation(),
        "preempt": preempt_operation(),
        "bind": bind_operation(),
    }
    return {
        f"/{verb}": {"post": {"summary": verb.capitalize(), "operationId": verb, **operation}}
        for verb, operation in operations.items()
    }


def status_extra(*codes: int) -> dict[str, Any]:
    """`openapi_extra` of a health endpoint answering `{"status": ...}` with the given codes."""
    schema = {"type": "object", "properties": {"status": {"type": "string"}}, "required": ["status"]}
    return {"responses": {str(code): _answer("status", schema) for code in codes}}
