"""Kafka request and response codec for the listener, on ``kio``'s dataclasses.

A Kafka frame is a 4-byte big-endian size and that many bytes. A request starts with
``api_key i16, api_version i16, correlation_id i32`` (every header version), so the
listener reads those three before it knows whether it can decode the rest: a request it
cannot decode (an API key or version it does not serve, or bytes that do not parse) is
``BadRequest`` and the server closes the connection, as Kafka's broker does.

The header versions come from ``kio``: requests of flexible versions carry header v2
(tagged fields), others v1; responses of flexible versions header v1, others v0, and
ApiVersions' response header is always v0 (kio's ``__header_schema__`` says so).
"""
from __future__ import annotations

import io
import struct
from functools import lru_cache

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32

__all__ = ["BadRequest", "peek_header", "decode_request", "encode_response", "response_class",
           "request_class", "FRAME_SIZE"]

FRAME_SIZE = struct.Struct(">i")
_PEEK = struct.Struct(">hhi")


class BadRequest(Exception):
    """A request that cannot be decoded (the connection is closed); the message says why."""


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a request frame."""
    if len(frame) < _PEEK.size:
        raise BadRequest(f"a request of {len(frame)} bytes is shorter than a request header")
    return _PEEK.unpack_from(frame)


@lru_cache(maxsize=None)
def request_class(api_key: int, version: int):
    try:
        return load_request_schema(api_key, version)
    except Exception:
        return None


@lru_cache(maxsize=None)
def response_class(api_key: int, version: int):
    try:
        return load_response_schema(api_key, version)
    except Exception:
        return None


@lru_cache(maxsize=None)
def _readers(api_key: int, version: int):
    cls = request_class(api_key, version)
    if cls is None:
        return None
    return entity_reader(cls.__header_schema__), entity_reader(cls)


@lru_cache(maxsize=None)
def _writers(api_key: int, version: int):
    cls = response_class(api_key, version)
    header = cls.__header_schema__
    return header, entity_writer(header), entity_writer(cls)


def decode_request(frame: bytes, api_key: int, version: int):
    """(header, request) of a frame whose first bytes ``peek_header`` read."""
    readers = _readers(api_key, version)
    if readers is None:
        raise BadRequest(f"no schema for API {api_key} version {version}")
    read_header, read_body = readers
    try:
        header, used = read_header(frame, 0)
        request, _ = read_body(frame, used)
    except Exception as exc:   # kio raises its own errors, and ValueError/IndexError on short input
        raise BadRequest(f"API {api_key} v{version}: {type(exc).__name__}: {exc}") from None
    return header, request


def encode_response(api_key: int, version: int, correlation_id: int, response) -> bytes:
    """The whole response frame (size prefix included)."""
    header_cls, write_header, write_body = _writers(api_key, version)
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    write_header(buf, header_cls(correlation_id=i32(correlation_id)))
    write_body(buf, response)
    out = buf.getbuffer()
    FRAME_SIZE.pack_into(out, 0, len(out) - 4)
    del out
    return buf.getvalue()
