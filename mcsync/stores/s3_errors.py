"""S3 answers → mcsync errors: one table, shared by the botocore and the obstore paths (and
by the Azure source, whose obstore errors carry Azure's codes: they are in the table too).

An S3 error is an HTTP status and, in its XML body, a ``<Code>``. Both SDKs are reduced to that
pair and looked up here: the code first (it is the more precise), then the status. botocore
hands both over (``ClientError.response``); obstore 0.12 exposes neither, only an exception
class and a message that quotes the status line and the XML body, so ``obstore_answer``
reads them from there — the one place that parses a message — and obstore's own classes
(NotFound, Precondition, PermissionDenied) decide where the text holds no S3 answer.

The translated error keeps the SDK's exception as ``__cause__``. Per-object errors only: a
store's ``check`` turns what its probe raised into a ConfigError (``errors.as_config_error``).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

import obstore.exceptions as obstore_exc

from ..errors import (
    AccessDenied,
    CredentialsExpired,
    IntegrityError,
    MCSyncError,
    NoSuchBucket,
    NotFound,
    Permanent,
    PreconditionFailed,
    Throttled,
    Transient,
    Unreachable,
)

_BY_CODE: dict[str, type[MCSyncError]] = {
    **dict.fromkeys(("NoSuchKey", "NotFound", "NoSuchUpload", "BlobNotFound"), NotFound),
    **dict.fromkeys(("NoSuchBucket", "ContainerNotFound"), NoSuchBucket),
    **dict.fromkeys(("PreconditionFailed", "ConditionNotMet"), PreconditionFailed),
    **dict.fromkeys(("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                     "AccessDeniedException", "AllAccessDisabled", "AuthenticationFailed",
                     "AuthorizationFailure", "AuthorizationPermissionMismatch"), AccessDenied),
    # Temporary keys past their end: the store renews them and the request is tried again.
    **dict.fromkeys(("ExpiredToken", "TokenRefreshRequired", "InvalidToken"),
                    CredentialsExpired),
    # The target computed another checksum than the one sent with the body: the bytes were
    # damaged on the way (or the checksum was wrong). Nothing was stored.
    **dict.fromkeys(("BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch",
                     "XAmzContentSHA256Mismatch"), IntegrityError),
    **dict.fromkeys(("SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                     "TooManyRequests", "ServiceUnavailable", "ServerBusy"), Throttled),
    # RequestExpired: the signature's date is too old (a request held back), not the keys:
    # signed again on a new try, with the same keys.
    **dict.fromkeys(("RequestTimeout", "InternalError", "RequestTimeTooSkewed",
                     "RequestExpired", "OperationTimedOut"), Transient),
}
_BY_STATUS: dict[int, type[MCSyncError]] = {
    404: NotFound, 412: PreconditionFailed, 401: AccessDenied, 403: AccessDenied,
    408: Transient, 429: Throttled, 503: Throttled,
}


@dataclass(frozen=True, slots=True)
class Answer:
    """What an S3 endpoint answered: its error code and HTTP status, as far as known."""

    code: str | None
    status: int | None
    message: str = ""

    def kind(self) -> type[MCSyncError] | None:
        if self.code in _BY_CODE:
            return _BY_CODE[self.code]
        if self.status in _BY_STATUS:
            return _BY_STATUS[self.status]
        if self.status is not None and self.status >= 500:
            return Transient
        if self.status is not None or self.code is not None:
            return Permanent
        return None


class S3Answered(Exception):
    """An S3 error answer received by a client with no exception type of its own (the CRT's,
    ``s3_crt``): translated by the table like the SDKs' errors."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(f"{answer.status} {answer.code or ''}: {answer.message}")
        self.answer = answer


def error_for(answer: Answer, what: str, bucket: str) -> MCSyncError:
    """The mcsync error for an S3 answer about ``what`` (an object's URL, or the store's)."""
    kind = answer.kind() or Transient
    label = answer.code or (str(answer.status) if answer.status is not None else "")
    detail = f" ({label})" if label else ""
    if kind is NotFound:
        return NotFound(f"{what}: no such object")
    if kind is NoSuchBucket:
        return NoSuchBucket(f"{what}: bucket {bucket!r} does not exist")
    if kind is PreconditionFailed:
        return PreconditionFailed(f"{what}: changed since it was listed")
    if kind is AccessDenied:
        return AccessDenied(f"{what}: access denied{detail}")
    if kind is CredentialsExpired:
        return CredentialsExpired(f"{what}: credentials expired{detail}")
    if kind is IntegrityError:
        return IntegrityError(f"{what}: the target refused the bytes: they do not match the "
                              f"checksum sent with them{detail}")
    text = f": {answer.message}" if answer.message and answer.message != label else ""
    return kind(f"{what}: {label or 'error'}{text}")


_CODE = re.compile(r"<Code>([^<]{1,100})</Code>")
_STATUS = re.compile(r"status code: (\d{3})")
_MESSAGE = re.compile(r"<Message>([^<]{0,300})</Message>")
# obstore's words for a response whose head came and whose body did not (reqwest's body error)
_BODY_BROKE = re.compile(r"response body|body error")
# A certificate refused in the TLS handshake: rustls's InvalidCertificate(UnknownIssuer) in
# obstore's debug text, OpenSSL's "certificate verify failed: <reason>" in botocore's.
_BAD_CERTIFICATE = re.compile(
    r"InvalidCertificate\(\s*(\w+)|certificate verify failed: ([^(\]\n]+)")


# A TLS alert the endpoint sent in (or right after) the handshake: it refused this client —
# without a certificate (certificate required), or for the one presented (unknown CA, bad or
# expired certificate, access denied). rustls's AlertReceived(CertificateRequired) in
# obstore's debug text, OpenSSL's [SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] in botocore's.
_REFUSED_HANDSHAKE = re.compile(r"AlertReceived\(\s*(\w+)|_ALERT_([A-Z_]+)\]")


def _refused(exc: BaseException, what: str) -> Permanent | None:
    """The error for a request whose TLS handshake the endpoint refused with an alert: not
    worth another try (a certificate is configuration). aiohttp's error is the cause of
    botocore's, so the whole chain is searched."""
    seen: BaseException | None = exc
    for _ in range(6):
        if seen is None:
            return None
        found = _REFUSED_HANDSHAKE.search(str(seen))
        if found is not None:
            break
        seen = seen.__cause__ or seen.__context__
    else:
        return None
    if found.group(1):  # CamelCase
        alert = re.sub(r"(?<!^)(?=[A-Z])", " ", found.group(1)).lower()
    else:
        alert = found.group(2).lower().replace("_", " ")
    return Permanent(f"{what}: the endpoint refused the TLS handshake ({alert}): it wants a "
                     "client certificate it trusts (--client-cert and --client-key; meta://: "
                     "MCSYNC_META_CLIENT_CERT and MCSYNC_META_CLIENT_KEY)")


def _untrusted(exc: BaseException, what: str) -> Permanent | None:
    """The error for a request whose TLS handshake refused the endpoint's certificate: not
    worth another try (no retry makes it trusted; unreachable, it was retried for minutes
    per object). obstore may trust a CA of the system's store that botocore (certifi) does
    not, so this can come mid-run, after the preflight passed."""
    found = _BAD_CERTIFICATE.search(str(exc))
    if found is None:
        return None
    return not_trusted(what, (found.group(1) or found.group(2)).strip())


def not_trusted(what: str, reason: str) -> Permanent:
    return Permanent(f"{what}: the endpoint's TLS certificate is not trusted ({reason}): a "
                     "private CA goes in AWS_CA_BUNDLE (meta://: MCSYNC_META_CA_BUNDLE)")


# The CRT's errors (``s3_crt``) that carry no S3 answer, by their names: a refused certificate
# (an untrusted one is AWS_IO_TLS_ERROR_NEGOTIATION_FAILURE, seen with moto over https and no
# CA given), else no connection made or one lost before the answer. The CRT hands over a 503
# SlowDown its own retries did not outlast as AWS_ERROR_S3_SLOW_DOWN, with no status.
_CRT_REFUSED_TLS = ("TLS_ERROR_NEGOTIATION_FAILURE", "CERTIFICATE", "TRUST_STORE")
_CRT_UNREACHABLE = ("SOCKET", "DNS", "CONNECTION", "HOST", "TLS")
_CRT_THROTTLED = ("SLOW_DOWN",)


def crt_error(name: str, what: str) -> MCSyncError:
    """The mcsync error for a CRT error named ``name`` that holds no S3 answer: a refused
    certificate is Permanent (as botocore's and obstore's are), SlowDown Throttled, no
    connection Unreachable, anything else Transient."""
    if any(word in name for word in _CRT_REFUSED_TLS):
        return not_trusted(what, name)
    if any(word in name for word in _CRT_THROTTLED):
        return Throttled(f"{what}: throttled ({name})")
    if any(word in name for word in _CRT_UNREACHABLE):
        return Unreachable(f"{what}: connection failed: {name}")
    return Transient(f"{what}: {name}")


def obstore_answer(exc: BaseException) -> Answer:
    text = str(exc)
    status = _STATUS.search(text)
    return _answer_in(text, int(status.group(1)) if status else None)


def crt_answer(status: int | None, body: bytes | None) -> Answer:
    """The answer the CRT's client (``s3_crt``) hands over: a status and the error's body."""
    return _answer_in(body.decode("utf-8", "replace") if body else "", status)


def _answer_in(text: str, status: int | None) -> Answer:
    code, message = _CODE.search(text), _MESSAGE.search(text)
    return Answer(code.group(1) if code else None, status, message.group(1) if message else "")


def answer_of(exc: BaseException) -> Answer | None:
    """The S3 answer inside either SDK's exception (or the CRT's), if it holds one."""
    if isinstance(exc, S3Answered):
        return exc.answer
    if isinstance(exc, obstore_exc.BaseError | FileNotFoundError):
        return obstore_answer(exc)
    boto = sys.modules.get("botocore.exceptions")
    if boto is not None and isinstance(exc, boto.ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return Answer(str(err.get("Code") or "") or None, int(status) if status else None,
                      str(err.get("Message") or ""))
    return None


def unclear_refusal(answer: Answer | None) -> bool:
    """A refusal that may be of keys replaced since: InvalidAccessKeyId, or a 403 with no code
    (a HEAD's answer has no body; botocore names its code after the status)."""
    if answer is None:
        return False
    if answer.code == "InvalidAccessKeyId":
        return True
    return answer.status == 403 and (answer.code is None or answer.code.isdigit())


def checksum_header_refusal(exc: BaseException) -> str | None:
    """The code of an answer that may be an endpoint refusing x-amz-checksum-crc32c itself
    (AWS answers InvalidRequest "Checksum Type mismatch" when an upload was created without the
    algorithm; others may not implement the header), else None. A wrong checksum is
    BadDigest, never this."""
    answer = answer_of(exc)
    if answer is not None and answer.code in {"InvalidRequest", "InvalidArgument",
                                              "NotImplemented"}:
        return answer.code
    return None


def translate(exc: BaseException, what: str, bucket: str) -> MCSyncError | None:
    """The mcsync error for an exception either SDK raised (None for anything else)."""
    if isinstance(exc, MCSyncError):
        return exc
    if isinstance(exc, S3Answered):
        return error_for(exc.answer, what, bucket)
    if isinstance(exc, obstore_exc.BaseError | FileNotFoundError):  # obstore raises both
        answer = obstore_answer(exc)
        if answer.kind() is not None:
            return error_for(answer, what, bucket)
        if isinstance(exc, obstore_exc.NotFoundError | FileNotFoundError):
            return NotFound(f"{what}: no such object")
        if isinstance(exc, obstore_exc.PreconditionError):
            return PreconditionFailed(f"{what}: changed since it was listed")
        if isinstance(exc, obstore_exc.PermissionDeniedError | obstore_exc.UnauthenticatedError):
            return AccessDenied(f"{what}: access denied")
        if _BODY_BROKE.search(str(exc)):  # answered, then the connection broke mid-body
            return Transient(f"{what}: the answer broke off: {first_line(exc)}")
        # No S3 answer in it: the request never got one (connection refused, reset, timeout).
        return _refused(exc, what) or _untrusted(exc, what) or Unreachable(
            f"{what}: {type(exc).__name__}: {first_line(exc)}")
    boto = sys.modules.get("botocore.exceptions")  # imported only once a request needs it
    if boto is not None:
        if isinstance(exc, boto.ClientError):
            return error_for(answer_of(exc) or Answer(None, None), what, bucket)
        if isinstance(exc, boto.NoCredentialsError | boto.PartialCredentialsError):
            return AccessDenied(f"{what}: no usable credentials ({type(exc).__name__})")
        if isinstance(exc, boto.ConnectionError | boto.HTTPClientError):
            return _refused(exc, what) or _untrusted(exc, what) or Unreachable(
                f"{what}: connection failed: {type(exc).__name__}")
        if isinstance(exc, boto.BotoCoreError):
            return Permanent(f"{what}: {exc}")
    if isinstance(exc, OSError):  # aiohttp payload / socket errors past the SDK's retries
        return Transient(f"{what}: {type(exc).__name__}: {exc}")
    return None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
