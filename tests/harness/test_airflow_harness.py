"""The harness gives real Airflow (migrated SQLite, DAG bundles) and a real S3 connection."""

from trainops_devcluster.airflow_home import xcom_value


def test_dag_runs_against_local_s3_through_aws_connection(run_dag, s3, bucket):
    s3.client().put_object(Bucket=bucket, Key="a/b.txt", Body=b"x")
    s3.client().put_object(Bucket=bucket, Key="c.txt", Body=b"y")

    run = run_dag("harness_smoke", conf={"bucket": bucket})

    assert run.state == "success"
    assert xcom_value(run, "read_bucket_listing") == 2
