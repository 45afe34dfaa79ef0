from cluster.transport._pb import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OptimizerConfig(_message.Message):
    __slots__ = ("sgd", "adam")
    SGD_FIELD_NUMBER: _ClassVar[int]
    ADAM_FIELD_NUMBER: _ClassVar[int]
    sgd: SGDConfig
    adam: AdamConfig
    def __init__(self, sgd: _Optional[_Union[SGDConfig, _Mapping]] = ..., adam: _Optional[_Union[AdamConfig, _Mapping]] = ...) -> None: ...

class SGDConfig(_message.Message):
    __slots__ = ("learning_rate", "momentum", "nesterov")
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    NESTEROV_FIELD_NUMBER: _ClassVar[int]
    learning_rate: float
    momentum: float
    nesterov: bool
    def __init__(self, learning_rate: _Optional[float] = ..., momentum: _Optional[float] = ..., nesterov: _Optional[bool] = ...) -> None: ...

class AdamConfig(_message.Message):
    __slots__ = ("learning_rate", "beta_1", "beta_2", "epsilon")
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    BETA_1_FIELD_NUMBER: _ClassVar[int]
    BETA_2_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    learning_rate: float
    beta_1: float
    beta_2: float
    epsilon: float
    def __init__(self, learning_rate: _Optional[float] = ..., beta_1: _Optional[float] = ..., beta_2: _Optional[float] = ..., epsilon: _Optional[float] = ...) -> None: ...

class CreateVariableRequest(_message.Message):
    __slots__ = ("name", "initial_value", "trainable", "optimizer", "exist_ok")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INITIAL_VALUE_FIELD_NUMBER: _ClassVar[int]
    TRAINABLE_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    EXIST_OK_FIELD_NUMBER: _ClassVar[int]
    name: str
    initial_value: _tensor_pb2.TensorChunk
    trainable: bool
    optimizer: OptimizerConfig
    exist_ok: bool
    def __init__(self, name: _Optional[str] = ..., initial_value: _Optional[_Union[_tensor_pb2.TensorChunk, _Mapping]] = ..., trainable: _Optional[bool] = ..., optimizer: _Optional[_Union[OptimizerConfig, _Mapping]] = ..., exist_ok: _Optional[bool] = ...) -> None: ...

class CreateVariableReply(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("names", "newer_than", "step")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    NEWER_THAN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    newer_than: _containers.RepeatedScalarFieldContainer[int]
    step: int
    def __init__(self, names: _Optional[_Iterable[str]] = ..., newer_than: _Optional[_Iterable[int]] = ..., step: _Optional[int] = ...) -> None: ...

class VariableValue(_message.Message):
    __slots__ = ("name", "version", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    value: _tensor_pb2.TensorChunk
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., value: _Optional[_Union[_tensor_pb2.TensorChunk, _Mapping]] = ...) -> None: ...

class PullReply(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[VariableValue]
    def __init__(self, values: _Optional[_Iterable[_Union[VariableValue, _Mapping]]] = ...) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("gradients", "step", "num_contributors", "optimizer", "contributor", "no_wait")
    GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    NUM_CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTOR_FIELD_NUMBER: _ClassVar[int]
    NO_WAIT_FIELD_NUMBER: _ClassVar[int]
    gradients: _containers.RepeatedCompositeFieldContainer[VariableValue]
    step: int
    num_contributors: int
    optimizer: OptimizerConfig
    contributor: int
    no_wait: bool
    def __init__(self, gradients: _Optional[_Iterable[_Union[VariableValue, _Mapping]]] = ..., step: _Optional[int] = ..., num_contributors: _Optional[int] = ..., optimizer: _Optional[_Union[OptimizerConfig, _Mapping]] = ..., contributor: _Optional[int] = ..., no_wait: _Optional[bool] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("versions",)
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, versions: _Optional[_Iterable[int]] = ...) -> None: ...

class AssignRequest(_message.Message):
    __slots__ = ("value", "mode")
    class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ASSIGN: _ClassVar[AssignRequest.Mode]
        ASSIGN_ADD: _ClassVar[AssignRequest.Mode]
        ASSIGN_SUB: _ClassVar[AssignRequest.Mode]
    ASSIGN: AssignRequest.Mode
    ASSIGN_ADD: AssignRequest.Mode
    ASSIGN_SUB: AssignRequest.Mode
    VALUE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    value: VariableValue
    mode: AssignRequest.Mode
    def __init__(self, value: _Optional[_Union[VariableValue, _Mapping]] = ..., mode: _Optional[_Union[AssignRequest.Mode, str]] = ...) -> None: ...

class AssignReply(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class VariableSlots(_message.Message):
    __slots__ = ("name", "optimizer", "iterations", "slots")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    optimizer: OptimizerConfig
    iterations: int
    slots: _containers.RepeatedCompositeFieldContainer[VariableValue]
    def __init__(self, name: _Optional[str] = ..., optimizer: _Optional[_Union[OptimizerConfig, _Mapping]] = ..., iterations: _Optional[int] = ..., slots: _Optional[_Iterable[_Union[VariableValue, _Mapping]]] = ...) -> None: ...

class ReadSlotsRequest(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class ReadSlotsReply(_message.Message):
    __slots__ = ("variables",)
    VARIABLES_FIELD_NUMBER: _ClassVar[int]
    variables: _containers.RepeatedCompositeFieldContainer[VariableSlots]
    def __init__(self, variables: _Optional[_Iterable[_Union[VariableSlots, _Mapping]]] = ...) -> None: ...

class WriteSlotsRequest(_message.Message):
    __slots__ = ("variables",)
    VARIABLES_FIELD_NUMBER: _ClassVar[int]
    variables: _containers.RepeatedCompositeFieldContainer[VariableSlots]
    def __init__(self, variables: _Optional[_Iterable[_Union[VariableSlots, _Mapping]]] = ...) -> None: ...

class WriteSlotsReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
