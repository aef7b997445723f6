import pytest

from trainops.checkpoints.uri import S3Uri


def test_parse_normalises_to_directory_form():
    uri = S3Uri.parse("s3://bucket/runs/demo/step-100")
    assert (uri.bucket, uri.prefix, uri.name, str(uri.parent)) == (
        "bucket",
        "runs/demo/step-100/",
        "step-100",
        "s3://bucket/runs/demo/",
    )
    assert str(S3Uri.parse("s3://bucket")) == "s3://bucket/"


@pytest.mark.parametrize("bad", ["s3:///runs/demo/", "s3://", "/runs/demo", "bucket/runs", "s3://b/a//c"])
def test_bad_uri_names_the_field(bad):
    with pytest.raises(ValueError, match="run_uri"):
        S3Uri.parse(bad, field="run_uri")


def test_missing_bucket_says_so():
    with pytest.raises(ValueError, match="run_uri has no bucket"):
        S3Uri.parse("s3:///runs/demo/", field="run_uri")
