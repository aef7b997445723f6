"""The demo trainer writes real, verifiable checkpoints and resumes from the latest verified one."""

import json
import os
import subprocess
import sys

from trainops.checkpoints.latest import latest_verified


def run_ranks(s3, run_uri, args, world=2, resume=""):
    env = {
        **os.environ,
        **s3.env(),
        "TRAINOPS_RUN_URI": run_uri,
        "TRAINOPS_RESUME_FROM": resume,
        "TRAINOPS_WORLD_SIZE": str(world),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "trainops_devcluster.demo.trainer", *args],
            env={**env, "JOB_COMPLETION_INDEX": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    return [(p.wait(), p.stdout.read()) for p in procs]


def test_two_ranks_write_committed_checkpoints_and_a_heartbeat(s3, bucket):
    run_uri = f"s3://{bucket}/runs/demo/"
    results = run_ranks(s3, run_uri, ["--steps", "30", "--checkpoint-every", "10", "--step-seconds", "0"])
    assert [code for code, _ in results] == [0, 0], results
    keys = {o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"]}
    for step in (10, 20, 30):
        assert {
            f"runs/demo/step-{step}/rank-0.bin",
            f"runs/demo/step-{step}/rank-1.bin",
            f"runs/demo/step-{step}/_COMMITTED",
        } <= keys
    latest = latest_verified(run_uri)
    assert latest.checkpoint.step == 30
    beat = json.loads(s3.client().get_object(Bucket=bucket, Key="runs/demo/heartbeat.json")["Body"].read())
    assert beat["step"] == 30 and beat["ranks"] == 2 and beat["saving"] is False


def test_resumes_from_latest_verified_and_skips_a_partial_save(s3, bucket):
    run_uri = f"s3://{bucket}/runs/demo/"
    run_ranks(s3, run_uri, ["--steps", "20", "--checkpoint-every", "10", "--step-seconds", "0"], world=1)
    # a save of step 30 that crashed half-way: one shard, no commit
    s3.client().put_object(Bucket=bucket, Key="runs/demo/step-30/rank-0.bin", Body=b"partial")
    results = run_ranks(
        s3, run_uri, ["--steps", "40", "--checkpoint-every", "10", "--step-seconds", "0"], world=1
    )
    code, output = results[0]
    assert code == 0, output
    assert f"resumed from {run_uri}step-20/ (step 20)" in output
    assert latest_verified(run_uri).checkpoint.step == 40


def test_resume_from_env_starts_the_attempt_and_a_restarted_pod_takes_newer_progress(s3, bucket):
    first, second = f"s3://{bucket}/runs/a/", f"s3://{bucket}/runs/b/"
    run_ranks(s3, first, ["--steps", "20", "--checkpoint-every", "10", "--step-seconds", "0"], world=1)
    # a new run seeded from another run's checkpoint: TRAINOPS_RESUME_FROM is where it starts
    code, output = run_ranks(
        s3, second, ["--steps", "30", "--step-seconds", "0"], world=1, resume=f"{first}step-10/"
    )[0]
    assert code == 0 and f"resumed from {first}step-10/ (step 10)" in output
    # restarted in place with the same env: its own newer verified checkpoint (step 30) wins
    code, output = run_ranks(
        s3, second, ["--steps", "40", "--step-seconds", "0"], world=1, resume=f"{first}step-10/"
    )[0]
    assert code == 0 and f"resumed from {second}step-30/ (step 30)" in output


def test_simulated_bug_exits_with_its_code(s3, bucket):
    code, output = run_ranks(
        s3,
        f"s3://{bucket}/runs/demo/",
        ["--steps", "20", "--step-seconds", "0", "--fail-at-step", "3", "--exit-code", "3"],
        world=1,
    )[0]
    assert code == 3 and "simulated bug" in output


def test_rank_0_gives_up_when_a_peer_never_saves(s3, bucket):
    env = {
        **os.environ,
        **s3.env(),
        "TRAINOPS_RUN_URI": f"s3://{bucket}/runs/demo/",
        "TRAINOPS_WORLD_SIZE": "2",
        "JOB_COMPLETION_INDEX": "0",
    }
    args = ["--steps", "10", "--checkpoint-every", "5", "--step-seconds", "0", "--shard-wait-seconds", "0.5"]
    done = subprocess.run(
        [sys.executable, "-m", "trainops_devcluster.demo.trainer", *args],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "NCCL timeout" in done.stderr


def test_newest_listed_resumes_from_the_newest_directory_and_a_torn_shard_fails_the_load(s3, bucket):
    """What a framework without verification does: the newest step-<N>/ with its commit marker (a save
    that crashed before it, step 30 here, is skipped), unverified; its torn shard fails the rank that
    loads it (and trainops' resume_from skips it)."""
    run_uri = f"s3://{bucket}/runs/demo/"
    args = ["--steps", "20", "--checkpoint-every", "10", "--step-seconds", "0"]
    run_ranks(s3, run_uri, args, world=2)
    s3.client().put_object(Bucket=bucket, Key="runs/demo/step-20/rank-1.bin", Body=b"torn")
    s3.client().put_object(Bucket=bucket, Key="runs/demo/step-30/rank-0.bin", Body=b"partial")
    more = ["--steps", "30", "--checkpoint-every", "10", "--step-seconds", "0", "--shard-wait-seconds", "10"]

    listed = run_ranks(s3, run_uri, [*more, "--resume", "newest-listed"], world=2)
    assert latest_verified(run_uri).checkpoint.step == 10
    verified = run_ranks(s3, run_uri, more, world=2)

    assert listed[1][0] != 0 and f"failed to load checkpoint {run_uri}step-20/" in listed[1][1], listed
    assert [code for code, _ in verified] == [0, 0], verified
    # Rank 1, whose shard was torn, resolves before it saves again. Rank 0 resolves on its own too and,
    # started late on a loaded machine, can find step-20 repaired by rank 1's new save: only rank 1's
    # choice is fixed.
    assert f"resumed from {run_uri}step-10/ (step 10)" in verified[1][1], verified
