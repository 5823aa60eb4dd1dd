"""Fixtures of the S3 store's own tests (``mtls_pki``: tests/conftest.py).

* ``mtls_proxy`` -- a ``testbed.tlsproxy.TlsProxy`` (per test) serving SeaweedFS's S3 over
  https and requiring a client certificate of that CA; ``mtls_endpoint`` is its address with
  SeaweedFS's keys, the CA as bundle and the client certificate (``meta_env()``,
  ``aws_env()`` and ``client()`` present it). Create buckets on ``seaweed`` itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from testbed.servers import S3Endpoint
from testbed.tlsproxy import TlsProxy

from ...conftest import MtlsFiles


@pytest.fixture
def mtls_proxy(seaweed: S3Endpoint, mtls_pki: MtlsFiles) -> Iterator[TlsProxy]:
    with TlsProxy(seaweed, server=mtls_pki.ca.server(), ca=mtls_pki.ca.ca).running() as proxy:
        yield proxy


@pytest.fixture
def mtls_endpoint(mtls_proxy: TlsProxy, mtls_pki: MtlsFiles) -> S3Endpoint:
    return dataclasses.replace(mtls_proxy.endpoint, client_cert=(
        str(mtls_pki.client.cert), str(mtls_pki.client.key)))
