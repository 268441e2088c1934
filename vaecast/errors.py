"""The errors vaecast raises on purpose, under one base class.

Each class carries the HTTP status and the short machine-readable `type` that the
server's edge (`vaecast.server.edge.http_errors`) turns into a JSON body
`{"error": {"type": ..., "message": ...}}`. Nothing below the edge knows about HTTP
beyond these two class attributes, and the messages are written for the user who
sent the request: they say what was wrong and, where it helps, what to send instead.
"""

from __future__ import annotations


class VaecastError(Exception):
    """Base of every error vaecast raises deliberately."""

    status: int = 500
    type: str = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def fields(self) -> dict[str, object]:
        """Machine-readable facts the JSON error carries beside its type and message."""
        return {}

    def detached(self) -> VaecastError:
        """The same error without a traceback, cause or context.

        An error kept on a job, or raised to each of many readers, must not hold the
        frames it was raised through: they reference tensors and requests, and as
        reference cycles they wait for a full garbage collection (a long pause of the
        event loop) to be freed.
        """
        copy = type(self).__new__(type(self), *self.args)
        copy.__dict__.update(self.__dict__)
        return copy


class InvalidRequestError(VaecastError):
    """The request is well-formed but its content cannot be decoded (bad tensor, bad parameter)."""

    status = 422
    type = "invalid_request"


class PreconditionRequiredError(VaecastError):
    """The request lacks a header the resource requires (a push session's block index)."""

    status = 428
    type = "precondition_required"


class MalformedRequestError(VaecastError):
    """The request cannot be parsed at all (broken multipart, unreadable parameter syntax)."""

    status = 400
    type = "bad_request"


class UnsupportedMediaError(VaecastError):
    """The upload is not a format vaecast reads (pickles are refused on purpose)."""

    status = 415
    type = "unsupported_media_type"


class PayloadTooLargeError(VaecastError):
    """The upload, or the video it would decode to, is over a configured limit."""

    status = 413
    type = "payload_too_large"


class NotFoundError(VaecastError):
    """No such job (or it has been evicted)."""

    status = 404
    type = "not_found"


class UnknownModelError(VaecastError):
    """The request names a model this server does not serve."""

    status = 404
    type = "model_not_found"


class JobStateError(VaecastError):
    """The job exists but is not in a state that allows the request."""

    status = 409
    type = "conflict"


class DecodeCancelled(VaecastError):
    """The decode was stopped on request (DELETE, client gone, shutdown)."""

    status = 409
    type = "cancelled"


class CancelledByShutdown(DecodeCancelled):
    """The decode was stopped because the server is shutting down: try another server."""

    status = 503
    type = "shutting_down"


class DecodeFailedError(VaecastError):
    """The decoder or the encoder raised; the job records the reason."""

    status = 500
    type = "decode_failed"


class ServerBusyError(VaecastError):
    """Every decode slot is taken and the queue is full; try again later."""

    status = 429
    type = "server_busy"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestTimeoutError(VaecastError):
    """The client sent its request body too slowly (nothing arrived for the body timeout)."""

    status = 408
    type = "request_timeout"


class SessionTimeoutError(VaecastError):
    """A push session received nothing for its idle timeout; the job records it."""

    status = 408
    type = "push_timeout"


class ShuttingDownError(VaecastError):
    """The server is draining for shutdown and takes no new jobs."""

    status = 503
    type = "shutting_down"


class GoneError(VaecastError):
    """The job existed but its video was evicted (retention time or memory budget)."""

    status = 410
    type = "gone"


class WeightsError(VaecastError):
    """A weights file is missing, unreadable, refused (not weights-only) or does not fit."""

    status = 500
    type = "invalid_weights"


class UnauthorizedError(VaecastError):
    """The server needs an API key and the request brought none, or a wrong one."""

    status = 401
    type = "unauthorized"


class ForbiddenError(VaecastError):
    """A page of another origin tried to change something (or to preflight) here."""

    status = 403
    type = "forbidden"


class MisdirectedRequestError(VaecastError):
    """The request names a host this server does not answer to (DNS rebinding guard)."""

    status = 421
    type = "misdirected_request"


class ClusterUnavailableError(VaecastError):
    """`--ray`: the Ray cluster cannot be reached (at start, or a job's state is lost)."""

    status = 503
    type = "cluster_unavailable"


class ReplicaFailedError(DecodeFailedError):
    """The decoder replica running a job died or became unreachable mid-job."""

    type = "replica_failed"


class JobInterruptedError(VaecastError):
    """The server stopped (a crash, a kill) while the job was queued or decoding: it
    came back from the store as failed, its video up to its last committed fragment."""

    status = 409
    type = "interrupted"


class StoreUnavailableError(VaecastError):
    """The durable store cannot write now (a full or read-only disk, an I/O error): what
    would be answered as saved is not, so it is not answered; it recovers by itself."""

    status = 503
    type = "store_unavailable"


class StoreError(VaecastError):
    """The durable store's folder cannot be made, opened or written (`--store`)."""

    status = 500
    type = "store_error"


def error_of_type(error_type: str, message: str) -> VaecastError:
    """The error a stored job's `{"type", "message"}` names: its class when vaecast has
    one of that type (a job stopped by shutdown is CancelledByShutdown, not the
    refusal ShuttingDownError), else a plain VaecastError that keeps the type (a record
    written by another version)."""
    if error_type == CancelledByShutdown.type:
        return CancelledByShutdown(message)
    pending: list[type[VaecastError]] = [VaecastError]
    while pending:
        cls = pending.pop(0)
        if cls.type == error_type and cls is not ServerBusyError:
            return cls(message)
        pending.extend(cls.__subclasses__())
    error = VaecastError(message)
    error.type = error_type
    return error
