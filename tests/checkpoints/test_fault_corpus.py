"""The fault corpus of issue 5: every partial or damaged checkpoint is refused, with the reason,
and ``latest_verified`` falls back to the newest good one."""

from __future__ import annotations

import json
import os

from tests.checkpoints.builders import (
    dcp_size,
    prefix_of,
    put,
    safetensors,
    write_dcp,
    write_deepspeed,
    write_hf,
    write_megatron_legacy,
    write_megatron_torch_dist,
)
from trainops.checkpoints.helper import commit
from trainops.checkpoints.latest import fresh_checkpoint, latest_verified
from trainops.checkpoints.verify import verify_checkpoint


def assert_refused(uri: str, reason: str, level: str = "metadata"):
    result = verify_checkpoint(uri, level=level)
    assert not result.ok, f"{uri} was verified but should not be"
    assert any(reason in text for text in result.reasons), result.reasons
    return result


def assert_latest(run: str, expected_name: str, skipped: list[str]) -> None:
    latest = latest_verified(run)
    assert latest.checkpoint is not None and latest.checkpoint.uri == f"{run}{expected_name}/"
    assert [result.uri for result in latest.skipped] == [f"{run}{name}/" for name in skipped]
    assert all(result.reasons for result in latest.skipped)


# --- PyTorch DCP / torchtitan -------------------------------------------------------------------


def test_good_torchtitan_checkpoint_verifies(client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "step-100/")
    result = verify_checkpoint(f"{run}step-100/")
    assert result.ok, result.reasons
    assert (result.format, result.step, result.files) == ("torchtitan", 100, 3)


def test_missing_metadata(client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "step-100/")
    write_dcp(client, bucket, prefix_of(run) + "step-200/")
    client.delete_object(Bucket=bucket, Key=prefix_of(run) + "step-200/.metadata")
    assert_refused(f"{run}step-200/", ".metadata is missing")
    assert_refused(f"{run}step-200/", ".metadata is missing", level="structural")
    assert_latest(run, "step-100", skipped=["step-200"])


def test_missing_shard(client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "step-100/")
    write_dcp(client, bucket, prefix_of(run) + "step-200/")
    client.delete_object(Bucket=bucket, Key=prefix_of(run) + "step-200/__1_0.distcp")
    assert_refused(f"{run}step-200/", "__1_0.distcp is missing (referenced by .metadata)")
    assert_latest(run, "step-100", skipped=["step-200"])


def test_truncated_shard(client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "step-200/")
    put(client, bucket, prefix_of(run) + "step-200/__0_0.distcp", b"")
    needed = dcp_size("__0_0.distcp")
    assert_refused(f"{run}step-200/", f"__0_0.distcp is 0 bytes but .metadata needs at least {needed}")


def test_shard_one_byte_shorter_than_offset_plus_length(client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "step-200/")
    needed = dcp_size("__1_0.distcp")  # DCP's shard ends exactly at its last item's offset+length
    put(client, bucket, prefix_of(run) + "step-200/__1_0.distcp", os.urandom(needed - 1))
    assert_refused(
        f"{run}step-200/", f"__1_0.distcp is {needed - 1} bytes but .metadata needs at least {needed}"
    )


def test_multipart_upload_never_completed(client, bucket, run):
    prefix = prefix_of(run) + "step-200/"
    write_dcp(client, bucket, prefix)
    client.delete_object(Bucket=bucket, Key=prefix + "__1_0.distcp")
    upload = client.create_multipart_upload(Bucket=bucket, Key=prefix + "__1_0.distcp")
    client.upload_part(
        Bucket=bucket, Key=prefix + "__1_0.distcp", UploadId=upload["UploadId"], PartNumber=1, Body=b"x" * 128
    )
    assert_refused(f"{run}step-200/", "its multipart upload was started and never completed")


def test_stale_nemo_unfinished_marker(client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "megatron_gpt--step=100-last/weights/")
    write_dcp(client, bucket, prefix_of(run) + "megatron_gpt--step=200-last/weights/")
    put(client, bucket, prefix_of(run) + "megatron_gpt--step=200-last-unfinished", b"")
    assert verify_checkpoint(f"{run}megatron_gpt--step=100-last/").ok
    result = assert_refused(f"{run}megatron_gpt--step=200-last/", "-unfinished exists beside the checkpoint")
    assert result.format == "nemo"
    assert_latest(run, "megatron_gpt--step=100-last", skipped=["megatron_gpt--step=200-last"])


# --- Megatron-LM and DeepSpeed: a tracker or `latest` alone never verifies -------------------------


def test_megatron_tracker_pointing_at_partial_torch_dist_dir(client, bucket, run):
    write_megatron_torch_dist(client, bucket, prefix_of(run) + "iter_0000100/")
    write_megatron_torch_dist(client, bucket, prefix_of(run) + "iter_0000200/")
    client.delete_object(Bucket=bucket, Key=prefix_of(run) + "iter_0000200/.metadata")
    put(client, bucket, prefix_of(run) + "latest_checkpointed_iteration.txt", b"200")
    assert_refused(f"{run}iter_0000200/", ".metadata is missing")
    assert_latest(run, "iter_0000100", skipped=["iter_0000200"])


def test_megatron_tracker_pointing_at_partial_legacy_dir(client, bucket, run):
    write_megatron_legacy(client, bucket, prefix_of(run) + "iter_0000100/")
    write_megatron_legacy(client, bucket, prefix_of(run) + "iter_0000200/")
    client.delete_object(Bucket=bucket, Key=prefix_of(run) + "iter_0000200/mp_rank_01/model_optim_rng.pt")
    put(client, bucket, prefix_of(run) + "iter_0000200/mp_rank_01/distrib_optim.pt", b"x")
    put(client, bucket, prefix_of(run) + "latest_checkpointed_iteration.txt", b"200\n")
    assert verify_checkpoint(f"{run}iter_0000100/").ok
    assert_refused(f"{run}iter_0000200/", "mp_rank_01/model_optim_rng.pt is missing")
    assert_latest(run, "iter_0000100", skipped=["iter_0000200"])


def test_megatron_iteration_newer_than_tracker(client, bucket, run):
    write_megatron_legacy(client, bucket, prefix_of(run) + "iter_0000300/")
    put(client, bucket, prefix_of(run) + "latest_checkpointed_iteration.txt", b"200")
    assert_refused(f"{run}iter_0000300/", "newer than latest_checkpointed_iteration.txt (200)")


def test_megatron_without_tracker(client, bucket, run):
    write_megatron_legacy(client, bucket, prefix_of(run) + "iter_0000100/")
    assert_refused(f"{run}iter_0000100/", "no latest_checkpointed_iteration.txt")


def test_deepspeed_latest_pointing_at_partial_dir(client, bucket, run):
    write_deepspeed(client, bucket, prefix_of(run) + "global_step100/")
    write_deepspeed(client, bucket, prefix_of(run) + "global_step200/", data_parallel=3)
    client.delete_object(
        Bucket=bucket, Key=prefix_of(run) + "global_step200/zero_pp_rank_1_mp_rank_00_optim_states.pt"
    )
    put(client, bucket, prefix_of(run) + "latest", b"global_step200")
    assert verify_checkpoint(f"{run}global_step100/").ok
    assert_refused(f"{run}global_step200/", "cover data-parallel ranks [0, 2], expected 0..2")
    assert_latest(run, "global_step100", skipped=["global_step200"])


def test_deepspeed_latest_pointing_at_dir_without_model_states(client, bucket, run):
    put(client, bucket, prefix_of(run) + "global_step200/zero_pp_rank_0_mp_rank_00_optim_states.pt", b"x")
    put(client, bucket, prefix_of(run) + "latest", b"global_step200")
    assert_refused(f"{run}global_step200/", "no mp_rank_XX_model_states.pt")


def test_deepspeed_tag_newer_than_latest(client, bucket, run):
    write_deepspeed(client, bucket, prefix_of(run) + "global_step300/")
    put(client, bucket, prefix_of(run) + "latest", b"global_step200")
    assert_refused(f"{run}global_step300/", "the save did not finish")


# --- Hugging Face Trainer ------------------------------------------------------------------------


def test_good_hf_checkpoint_verifies(client, bucket, run):
    write_hf(client, bucket, prefix_of(run) + "checkpoint-100/", step=100)
    result = verify_checkpoint(f"{run}checkpoint-100/")
    assert result.ok, result.reasons
    assert result.format == "hf"


def test_hf_without_trainer_state(client, bucket, run):
    write_hf(client, bucket, prefix_of(run) + "checkpoint-100/", step=100)
    write_hf(client, bucket, prefix_of(run) + "checkpoint-200/", step=200)
    client.delete_object(Bucket=bucket, Key=prefix_of(run) + "checkpoint-200/trainer_state.json")
    assert_refused(f"{run}checkpoint-200/", "trainer_state.json is missing", level="structural")
    assert_latest(run, "checkpoint-100", skipped=["checkpoint-200"])


def test_checkpoints_at_or_below_newer_than_step_are_not_verified(client, bucket, run):
    write_hf(client, bucket, prefix_of(run) + "checkpoint-100/", step=100)
    write_hf(client, bucket, prefix_of(run) + "checkpoint-200/", step=200)
    client.delete_object(Bucket=bucket, Key=prefix_of(run) + "checkpoint-200/trainer_state.json")
    latest = latest_verified(run, newer_than_step=100)
    assert latest.checkpoint is None
    assert [result.uri for result in latest.skipped] == [f"{run}checkpoint-200/"]  # 100 not looked at
    assert fresh_checkpoint(run, newer_than_step=100) is None
    assert fresh_checkpoint(run, newer_than_step=99).uri == f"{run}checkpoint-100/"


def test_hf_without_weights(client, bucket, run):
    write_hf(client, bucket, prefix_of(run) + "checkpoint-200/", step=200)
    client.delete_object(Bucket=bucket, Key=prefix_of(run) + "checkpoint-200/model.safetensors")
    assert_refused(f"{run}checkpoint-200/", "no weights")


def test_hf_truncated_safetensors(client, bucket, run):
    write_hf(client, bucket, prefix_of(run) + "checkpoint-200/", step=200)
    put(client, bucket, prefix_of(run) + "checkpoint-200/model.safetensors", safetensors()[:-5])
    assert_refused(f"{run}checkpoint-200/", "model.safetensors is")


def test_hf_sharded_index_naming_a_missing_shard(client, bucket, run):
    prefix = prefix_of(run) + "checkpoint-200/"
    write_hf(client, bucket, prefix, step=200)
    client.delete_object(Bucket=bucket, Key=prefix + "model.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    put(client, bucket, prefix + "model.safetensors.index.json", json.dumps(index).encode())
    put(client, bucket, prefix + "model-00001-of-00002.safetensors", safetensors())
    assert_refused(f"{run}checkpoint-200/", "model-00002-of-00002.safetensors is missing")


def test_hf_trainer_state_from_another_step(client, bucket, run):
    write_hf(client, bucket, prefix_of(run) + "checkpoint-200/", step=150)
    assert_refused(f"{run}checkpoint-200/", "global_step 150, the directory says 200")


# --- The trainops manifest and _COMMITTED ---------------------------------------------------------


def committed_checkpoint(client, bucket, run, name: str) -> str:
    write_dcp(client, bucket, prefix_of(run) + f"{name}/")
    commit(f"{run}{name}/")
    return prefix_of(run) + f"{name}/"


def test_committed_checkpoint_verifies(client, bucket, run):
    committed_checkpoint(client, bucket, run, "step-100")
    result = verify_checkpoint(f"{run}step-100/")
    assert result.ok, result.reasons
    assert result.format == "trainops+torchtitan"


def test_checksum_mismatch(client, bucket, run):
    committed_checkpoint(client, bucket, run, "step-100")
    prefix = committed_checkpoint(client, bucket, run, "step-200")
    put(client, bucket, prefix + "__0_0.distcp", os.urandom(dcp_size("__0_0.distcp")))  # other bytes
    assert_refused(f"{run}step-200/", "__0_0.distcp checksum mismatch")
    assert_latest(run, "step-100", skipped=["step-200"])


def test_committed_without_manifest(client, bucket, run):
    prefix = committed_checkpoint(client, bucket, run, "step-200")
    client.delete_object(Bucket=bucket, Key=prefix + "trainops-manifest.json")
    assert_refused(
        f"{run}step-200/", "_COMMITTED exists but trainops-manifest.json is missing", level="structural"
    )


def test_manifest_without_committed(client, bucket, run):
    prefix = committed_checkpoint(client, bucket, run, "step-200")
    client.delete_object(Bucket=bucket, Key=prefix + "_COMMITTED")
    assert_refused(f"{run}step-200/", "_COMMITTED is missing")


def test_manifest_naming_a_missing_file(client, bucket, run):
    prefix = committed_checkpoint(client, bucket, run, "step-200")
    put(client, bucket, prefix + "extra.bin", b"late")
    client.delete_object(Bucket=bucket, Key=prefix + "extra.bin")
    client.delete_object(Bucket=bucket, Key=prefix + "__1_0.distcp")
    assert_refused(f"{run}step-200/", "__1_0.distcp is missing (listed in trainops-manifest.json)")


def test_manifest_hash_not_matching_committed(client, bucket, run):
    prefix = committed_checkpoint(client, bucket, run, "step-200")
    manifest = json.loads(
        client.get_object(Bucket=bucket, Key=prefix + "trainops-manifest.json")["Body"].read()
    )
    manifest["files"] = [entry for entry in manifest["files"] if entry["key"] != "__1_0.distcp"]
    put(client, bucket, prefix + "trainops-manifest.json", json.dumps(manifest).encode())
    assert_refused(f"{run}step-200/", "does not match the SHA-256 recorded in _COMMITTED")


def test_file_added_after_commit(client, bucket, run):
    prefix = committed_checkpoint(client, bucket, run, "step-200")
    put(client, bucket, prefix + "__2_0.distcp", b"late writer")
    assert_refused(f"{run}step-200/", "__2_0.distcp is not in trainops-manifest.json")


# --- Layouts no format claims ----------------------------------------------------------------------


def test_unrecognised_directory_is_not_verified(client, bucket, run):
    put(client, bucket, prefix_of(run) + "step-100/notes.txt", b"hello")
    assert_refused(f"{run}step-100/", "no recognised checkpoint layout")


def test_empty_prefix_is_not_verified(s3, bucket, run):
    assert_refused(f"{run}step-100/", "no objects under")


def test_run_with_nothing_verified_reports_every_skip(client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "step-100/")
    client.delete_object(Bucket=bucket, Key=prefix_of(run) + "step-100/.metadata")
    put(client, bucket, prefix_of(run) + "heartbeat.json", b"{}")
    latest = latest_verified(run)
    assert latest.checkpoint is None
    assert [result.uri for result in latest.skipped] == [f"{run}step-100/"]
