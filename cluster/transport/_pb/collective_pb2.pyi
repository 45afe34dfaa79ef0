from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Frame(_message.Message):
    __slots__ = ("src_rank", "group", "seq", "step", "chunk", "signature", "offset", "total_bytes", "goodbye", "lost_task", "data")
    SRC_RANK_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    GOODBYE_FIELD_NUMBER: _ClassVar[int]
    LOST_TASK_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    src_rank: int
    group: str
    seq: int
    step: int
    chunk: int
    signature: str
    offset: int
    total_bytes: int
    goodbye: bool
    lost_task: str
    data: bytes
    def __init__(self, src_rank: _Optional[int] = ..., group: _Optional[str] = ..., seq: _Optional[int] = ..., step: _Optional[int] = ..., chunk: _Optional[int] = ..., signature: _Optional[str] = ..., offset: _Optional[int] = ..., total_bytes: _Optional[int] = ..., goodbye: _Optional[bool] = ..., lost_task: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class ExchangeSummary(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: int
    def __init__(self, frames: _Optional[int] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ("group", "rank", "world_size", "task", "generation")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    group: str
    rank: int
    world_size: int
    task: str
    generation: int
    def __init__(self, group: _Optional[str] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., task: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("rank", "task")
    RANK_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    rank: int
    task: str
    def __init__(self, rank: _Optional[int] = ..., task: _Optional[str] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("group", "seq", "task", "reason", "lost_task", "lost_address", "generation")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LOST_TASK_FIELD_NUMBER: _ClassVar[int]
    LOST_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    group: str
    seq: int
    task: str
    reason: str
    lost_task: str
    lost_address: str
    generation: int
    def __init__(self, group: _Optional[str] = ..., seq: _Optional[int] = ..., task: _Optional[str] = ..., reason: _Optional[str] = ..., lost_task: _Optional[str] = ..., lost_address: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class AbortReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
