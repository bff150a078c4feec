"""Remote configuration from the URL and the AWS_* environment, as a table of bad inputs.

Each bad input is refused with a typed error and a hint, before any request.
"""

from __future__ import annotations

import pytest

from statelog.remote import RemoteConfigError, parse_remote_url
from statelog.remote.client import is_transient

GOOD = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_ACCESS_KEY_ID": "k",
    "AWS_SECRET_ACCESS_KEY": "s",
    "AWS_REGION": "eu-west-1",
    "AWS_DEFAULT_REGION": "us-east-2",
    "AWS_ALLOW_HTTP": "true",
}


@pytest.mark.parametrize(
    ("url", "env", "why"),
    [
        ("file://host/tmp/x", GOOD, "file:///absolute"),
        ("file:///tmp/../x", GOOD, "path"),
        ("gs://bucket/p", GOOD, "s3://"),
        ("s3://Bad_Bucket/p", GOOD, "bucket"),
        ("s3://bucket/a//b", GOOD, "prefix"),
        ("s3://bucket/a/../b", GOOD, "prefix"),
        ("s3://bucket/p", {**GOOD, "AWS_ALLOW_HTTP": "false"}, "plain HTTP"),
        ("s3://bucket/p", {**GOOD, "AWS_SECRET_ACCESS_KEY": ""}, "only one"),
        ("s3://bucket/p", {**GOOD, "AWS_ENDPOINT_URL": "ftp://h"}, "http(s)"),
    ],
)
def test_bad_config_is_refused_with_a_hint(url: str, env: dict[str, str], why: str) -> None:
    with pytest.raises(RemoteConfigError) as err:
        parse_remote_url(url, env)
    assert why in str(err.value) and err.value.hint


def test_good_config_reads_the_standard_environment() -> None:
    cfg = parse_remote_url("s3://bucket/shards/07/", GOOD)
    assert (cfg.bucket, cfg.prefix, cfg.endpoint) == (
        "bucket",
        "shards/07",
        GOOD["AWS_ENDPOINT_URL"],
    )
    assert cfg.region == "eu-west-1"  # AWS_REGION wins over AWS_DEFAULT_REGION
    assert cfg.allow_http and cfg.access_key_id == "k"
    assert "secret_access_key" not in repr(cfg) and "access_key_id" not in repr(cfg)


class _Generic(Exception):
    pass


def test_only_transient_failures_are_retried() -> None:
    import obstore.exceptions as ox

    assert is_transient(ox.GenericError("HTTP error: error sending request"))
    assert is_transient(ox.GenericError("Server returned non-2xx status code: 503 Slow Down"))
    assert not is_transient(ox.GenericError("Server returned non-2xx status code: 400 Bad"))
    assert not is_transient(ox.PreconditionError("precondition"))
    assert not is_transient(ox.AlreadyExistsError("exists"))
    assert not is_transient(FileNotFoundError("gone"))
    assert not is_transient(_Generic("not obstore's"))
