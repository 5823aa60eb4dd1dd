"""What GCS's JSON API answers, read into mcsync's terms: an object resource as an
``ObjectInfo`` (the MD5 in hex as its ETag, the generation as its version, the CRC32C, the
update time: why each, ``gcs``'s docstring), a hash out of ``x-goog-hash``, a JSON body, an
error's message. Pure."""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..errors import Permanent, Transient
from ..types import ObjectInfo


def object_info(key: str, item: Mapping[str, Any]) -> ObjectInfo:
    generation = item.get("generation")
    return ObjectInfo(
        key,
        int(item["size"]),
        md5_hex(item.get("md5Hash")),
        timestamp(item.get("updated")),
        str(generation) if generation is not None else None,
        item.get("crc32c") or None,
    )


def md5_hex(value: str | None) -> str | None:
    if not value:
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 16 else None


def timestamp(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()  # RFC 3339 with 'Z' (Python 3.11)
    except ValueError:
        return None


def hash_of(headers: Mapping[str, str], kind: str) -> str | None:
    """One hash out of ``x-goog-hash: crc32c=...,md5=...`` (the header may repeat)."""
    values = headers.getall("x-goog-hash", []) if hasattr(headers, "getall") else [
        headers.get("x-goog-hash", "")]
    for value in values:
        for part in value.split(","):
            name, _, encoded = part.strip().partition("=")
            if name == kind and encoded:
                return encoded
    return None


def as_json(body: bytes, what: str) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise Transient(f"{what}: the server's answer is not JSON") from None
    if not isinstance(data, dict):
        raise Permanent(f"{what}: unexpected answer from the server")
    return data


def error_message(body: bytes) -> str:
    """GCS's error message (``{"error": {"message": ...}}``), else the first line of the body."""
    text = body.decode("utf-8", "replace").strip()
    with contextlib.suppress(ValueError, KeyError, TypeError):
        message = json.loads(text)["error"]["message"]
        if isinstance(message, str):
            text = message
    return text.splitlines()[0][:300] if text else ""
