from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunRequest(_message.Message):
    __slots__ = ("run_id", "payload", "nonce", "sync_step", "contributor", "num_contributors")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SYNC_STEP_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTOR_FIELD_NUMBER: _ClassVar[int]
    NUM_CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    run_id: int
    payload: bytes
    nonce: bytes
    sync_step: int
    contributor: int
    num_contributors: int
    def __init__(self, run_id: _Optional[int] = ..., payload: _Optional[bytes] = ..., nonce: _Optional[bytes] = ..., sync_step: _Optional[int] = ..., contributor: _Optional[int] = ..., num_contributors: _Optional[int] = ...) -> None: ...

class RunReply(_message.Message):
    __slots__ = ("outcome", "payload", "mac", "error_type", "error_message", "traceback")
    class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OK: _ClassVar[RunReply.Outcome]
        FAILED: _ClassVar[RunReply.Outcome]
    OK: RunReply.Outcome
    FAILED: RunReply.Outcome
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    outcome: RunReply.Outcome
    payload: bytes
    mac: bytes
    error_type: str
    error_message: str
    traceback: str
    def __init__(self, outcome: _Optional[_Union[RunReply.Outcome, str]] = ..., payload: _Optional[bytes] = ..., mac: _Optional[bytes] = ..., error_type: _Optional[str] = ..., error_message: _Optional[str] = ..., traceback: _Optional[str] = ...) -> None: ...
