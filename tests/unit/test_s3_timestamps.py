"""S3 timestamps are parsed without dateutil and land on the same instants as botocore's."""

from datetime import UTC, datetime

import pytest
from botocore.utils import parse_timestamp

from mcsync.stores.s3_clients import parse_timestamp as _parse_timestamp

SAME_AS_BOTOCORE = [
    "2026-11-29T23:47:49.000Z",  # ListObjectsV2 / CopyObjectResult bodies
    "2026-11-29T23:47:49.123456Z",
    "2026-11-29T23:47:49+02:00",
    "Sun, 29 Nov 2026 23:47:49 GMT",  # Last-Modified header of HEAD / GET
    1764460069,
    "1764460069",
]


@pytest.mark.parametrize("value", SAME_AS_BOTOCORE)
def test_same_instant_as_botocore(value):
    ours = _parse_timestamp(value)
    assert ours.tzinfo is not None
    assert ours == parse_timestamp(value)


def test_a_time_without_zone_is_utc():
    assert _parse_timestamp("2026-11-29T23:47:49") == datetime(2026, 11, 29, 23, 47, 49,
                                                                tzinfo=UTC)
