"""A one-task DAG that proves the Airflow test harness works (used by tests/harness)."""

from airflow.sdk import dag, task


@dag(schedule=None, tags=["test"])
def harness_smoke():
    @task
    def read_bucket_listing(bucket: str) -> int:
        from airflow.providers.amazon.aws.hooks.s3 import S3Hook

        return len(S3Hook(aws_conn_id="aws_default").list_keys(bucket_name=bucket))

    read_bucket_listing("{{ dag_run.conf['bucket'] }}")


harness_smoke()
