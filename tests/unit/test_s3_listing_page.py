"""A ListObjectsV2 answer read by ``s3_crt.listing_page`` as botocore reads it: names decoded only
where the answer says they are URL-encoded, files and prefixes apart, the continuation."""

from datetime import UTC, datetime

import pytest

from mcsync.errors import Transient
from mcsync.stores.s3_requests import listing_page

NS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'


def _answer(encoding: str, key: str, prefix: str, truncated: str = "true") -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult {NS}>'
            f"<Name>b</Name><Prefix>p%2F</Prefix><KeyCount>2</KeyCount>"
            f"<IsTruncated>{truncated}</IsTruncated>"
            f"<Contents><Key>{key}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>"
            f"<ETag>&quot;abc&quot;</ETag><Size>7</Size></Contents>"
            f"<CommonPrefixes><Prefix>{prefix}</Prefix></CommonPrefixes>"
            f"{encoding}<NextContinuationToken>tok+/=</NextContinuationToken>"
            f"</ListBucketResult>").encode()


def test_url_encoded_names_are_decoded_as_botocore_does():
    page = listing_page(_answer("<EncodingType>url</EncodingType>", "p/a+b%2Bc%20d%C3%A9",
                                "p/x%26y/"), "s3://b/p/")
    assert page["Contents"] == [{"Key": "p/a b+c dé", "Size": 7, "ETag": '"abc"',
                                 "LastModified": datetime(2026, 1, 1, tzinfo=UTC)}]
    assert page["CommonPrefixes"] == [{"Prefix": "p/x&y/"}]
    assert page["IsTruncated"] is True
    assert page["NextContinuationToken"] == "tok+/="  # a token is never decoded


def test_names_are_left_alone_where_the_answer_is_not_encoded():
    page = listing_page(_answer("", "p/a+b%2B", "p/%20/", truncated="false"), "s3://b/p/")
    assert [c["Key"] for c in page["Contents"]] == ["p/a+b%2B"]
    assert page["CommonPrefixes"] == [{"Prefix": "p/%20/"}]
    assert page["IsTruncated"] is False


def test_an_answer_that_is_no_xml_is_transient():
    with pytest.raises(Transient, match="no XML"):
        listing_page(b"<html>busy", "s3://b/")
