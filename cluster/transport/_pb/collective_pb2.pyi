from cluster.transport._pb import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CollectiveKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COLLECTIVE_KIND_UNSPECIFIED: _ClassVar[CollectiveKind]
    ALL_REDUCE: _ClassVar[CollectiveKind]
    ALL_GATHER: _ClassVar[CollectiveKind]
    BROADCAST: _ClassVar[CollectiveKind]
    REDUCE_SCATTER: _ClassVar[CollectiveKind]
    BARRIER: _ClassVar[CollectiveKind]

class ReduceOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REDUCE_OP_UNSPECIFIED: _ClassVar[ReduceOp]
    SUM: _ClassVar[ReduceOp]
    MEAN: _ClassVar[ReduceOp]
    MAX: _ClassVar[ReduceOp]
    MIN: _ClassVar[ReduceOp]
COLLECTIVE_KIND_UNSPECIFIED: CollectiveKind
ALL_REDUCE: CollectiveKind
ALL_GATHER: CollectiveKind
BROADCAST: CollectiveKind
REDUCE_SCATTER: CollectiveKind
BARRIER: CollectiveKind
REDUCE_OP_UNSPECIFIED: ReduceOp
SUM: ReduceOp
MEAN: ReduceOp
MAX: ReduceOp
MIN: ReduceOp

class CollectiveSignature(_message.Message):
    __slots__ = ("kind", "op", "meta", "root")
    KIND_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    kind: CollectiveKind
    op: ReduceOp
    meta: _tensor_pb2.TensorMeta
    root: int
    def __init__(self, kind: _Optional[_Union[CollectiveKind, str]] = ..., op: _Optional[_Union[ReduceOp, str]] = ..., meta: _Optional[_Union[_tensor_pb2.TensorMeta, _Mapping]] = ..., root: _Optional[int] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("src_rank", "group", "seq", "step", "chunk", "signature", "offset", "data")
    SRC_RANK_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    src_rank: int
    group: str
    seq: int
    step: int
    chunk: int
    signature: CollectiveSignature
    offset: int
    data: bytes
    def __init__(self, src_rank: _Optional[int] = ..., group: _Optional[str] = ..., seq: _Optional[int] = ..., step: _Optional[int] = ..., chunk: _Optional[int] = ..., signature: _Optional[_Union[CollectiveSignature, _Mapping]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ExchangeSummary(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: int
    def __init__(self, frames: _Optional[int] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ("group", "rank", "world_size", "task")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    group: str
    rank: int
    world_size: int
    task: str
    def __init__(self, group: _Optional[str] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., task: _Optional[str] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("rank", "task")
    RANK_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    rank: int
    task: str
    def __init__(self, rank: _Optional[int] = ..., task: _Optional[str] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("group", "seq", "task", "reason")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    group: str
    seq: int
    task: str
    reason: str
    def __init__(self, group: _Optional[str] = ..., seq: _Optional[int] = ..., task: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class AbortReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
