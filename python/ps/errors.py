"""Exceptions of the ps package: one class per gRPC status code.

Every failure of the servers or of the client's own checks arrives as a subclass of
`ps.Error` that carries the gRPC status code (`.code`, an int; `.code_name`, e.g.
"INVALID_ARGUMENT") and the message (`.message`), e.g.::

    try:
        client.push_dense("w", grad)
    except ps.InvalidArgument as e:   # wrong dtype or shape, NaN gradient, ...
        print(e.code_name, e.message)
"""

# gRPC status codes (the same numbers as absl::StatusCode).
_CODES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
    6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE",
    15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class Error(Exception):
    """A failed call: `.code` (gRPC status code), `.code_name`, `.message`."""

    code = 2

    def __init__(self, message):
        super().__init__(message)
        self.message = message

    @property
    def code_name(self):
        return _CODES.get(self.code, "UNKNOWN")

    def __str__(self):
        return "%s: %s" % (self.code_name, self.message)


def _subclass(name, code):
    return type(name, (Error,), {"code": code, "__doc__": "gRPC status %s." % _CODES[code]})


Cancelled = _subclass("Cancelled", 1)
Unknown = _subclass("Unknown", 2)
InvalidArgument = _subclass("InvalidArgument", 3)
DeadlineExceeded = _subclass("DeadlineExceeded", 4)
NotFound = _subclass("NotFound", 5)
AlreadyExists = _subclass("AlreadyExists", 6)
PermissionDenied = _subclass("PermissionDenied", 7)
ResourceExhausted = _subclass("ResourceExhausted", 8)
FailedPrecondition = _subclass("FailedPrecondition", 9)
Aborted = _subclass("Aborted", 10)
OutOfRange = _subclass("OutOfRange", 11)
Unimplemented = _subclass("Unimplemented", 12)
Internal = _subclass("Internal", 13)
Unavailable = _subclass("Unavailable", 14)
DataLoss = _subclass("DataLoss", 15)
Unauthenticated = _subclass("Unauthenticated", 16)

_BY_CODE = {cls.code: cls for cls in (
    Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists, PermissionDenied,
    ResourceExhausted, FailedPrecondition, Aborted, OutOfRange, Unimplemented, Internal, Unavailable,
    DataLoss, Unauthenticated)}


def from_status(code, message):
    """The exception for a failed status (used by the C++ extension)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        err = Error(message)
        err.code = code
        return err
    return cls(message)
