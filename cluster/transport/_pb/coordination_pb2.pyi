from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClusterEvent(_message.Message):
    __slots__ = ("kind", "task", "reporter", "error_type", "message", "exit_code", "generation")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        LOST: _ClassVar[ClusterEvent.Kind]
        FAILED: _ClassVar[ClusterEvent.Kind]
        LEFT: _ClassVar[ClusterEvent.Kind]
        ABORTED: _ClassVar[ClusterEvent.Kind]
        PREEMPTED: _ClassVar[ClusterEvent.Kind]
    LOST: ClusterEvent.Kind
    FAILED: ClusterEvent.Kind
    LEFT: ClusterEvent.Kind
    ABORTED: ClusterEvent.Kind
    PREEMPTED: ClusterEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    REPORTER_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    kind: ClusterEvent.Kind
    task: str
    reporter: str
    error_type: str
    message: str
    exit_code: int
    generation: int
    def __init__(self, kind: _Optional[_Union[ClusterEvent.Kind, str]] = ..., task: _Optional[str] = ..., reporter: _Optional[str] = ..., error_type: _Optional[str] = ..., message: _Optional[str] = ..., exit_code: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("task", "incarnation", "coordinator", "cluster_digest")
    TASK_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_DIGEST_FIELD_NUMBER: _ClassVar[int]
    task: str
    incarnation: int
    coordinator: str
    cluster_digest: bytes
    def __init__(self, task: _Optional[str] = ..., incarnation: _Optional[int] = ..., coordinator: _Optional[str] = ..., cluster_digest: _Optional[bytes] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("coordinator_incarnation",)
    COORDINATOR_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    coordinator_incarnation: int
    def __init__(self, coordinator_incarnation: _Optional[int] = ...) -> None: ...

class CoordinationHeartbeatRequest(_message.Message):
    __slots__ = ("task", "incarnation", "events_seen")
    TASK_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    EVENTS_SEEN_FIELD_NUMBER: _ClassVar[int]
    task: str
    incarnation: int
    events_seen: int
    def __init__(self, task: _Optional[str] = ..., incarnation: _Optional[int] = ..., events_seen: _Optional[int] = ...) -> None: ...

class CoordinationHeartbeatReply(_message.Message):
    __slots__ = ("events", "next_event", "unregistered", "coordinator_incarnation", "unregistered_count", "generation", "joining")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_EVENT_FIELD_NUMBER: _ClassVar[int]
    UNREGISTERED_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    UNREGISTERED_COUNT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    JOINING_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[ClusterEvent]
    next_event: int
    unregistered: _containers.RepeatedScalarFieldContainer[str]
    coordinator_incarnation: int
    unregistered_count: int
    generation: int
    joining: int
    def __init__(self, events: _Optional[_Iterable[_Union[ClusterEvent, _Mapping]]] = ..., next_event: _Optional[int] = ..., unregistered: _Optional[_Iterable[str]] = ..., coordinator_incarnation: _Optional[int] = ..., unregistered_count: _Optional[int] = ..., generation: _Optional[int] = ..., joining: _Optional[int] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: ClusterEvent
    def __init__(self, event: _Optional[_Union[ClusterEvent, _Mapping]] = ...) -> None: ...

class ReportReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegroupRequest(_message.Message):
    __slots__ = ("task", "incarnation", "after_generation", "enlist")
    TASK_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    AFTER_GENERATION_FIELD_NUMBER: _ClassVar[int]
    ENLIST_FIELD_NUMBER: _ClassVar[int]
    task: str
    incarnation: int
    after_generation: int
    enlist: bool
    def __init__(self, task: _Optional[str] = ..., incarnation: _Optional[int] = ..., after_generation: _Optional[int] = ..., enlist: _Optional[bool] = ...) -> None: ...

class RegroupReply(_message.Message):
    __slots__ = ("status", "generation", "members", "message", "gone")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        WAITING: _ClassVar[RegroupReply.Status]
        FORMED: _ClassVar[RegroupReply.Status]
        BELOW_MIN: _ClassVar[RegroupReply.Status]
        REFUSED: _ClassVar[RegroupReply.Status]
    WAITING: RegroupReply.Status
    FORMED: RegroupReply.Status
    BELOW_MIN: RegroupReply.Status
    REFUSED: RegroupReply.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GONE_FIELD_NUMBER: _ClassVar[int]
    status: RegroupReply.Status
    generation: int
    members: _containers.RepeatedScalarFieldContainer[str]
    message: str
    gone: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, status: _Optional[_Union[RegroupReply.Status, str]] = ..., generation: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ..., message: _Optional[str] = ..., gone: _Optional[_Iterable[str]] = ...) -> None: ...
