"""Write checkpoints the way each framework lays them out, into a bucket of the local S3 server."""

from __future__ import annotations

import json
import os
import struct

from tests.checkpoints import torch_dcp


def put(client, bucket: str, key: str, body: bytes) -> None:
    client.put_object(Bucket=bucket, Key=key, Body=body)


def prefix_of(uri: str) -> str:
    """The key prefix of an ``s3://bucket/prefix/`` URI."""
    return uri.split("/", 3)[3]


def write_dcp(client, bucket: str, prefix: str) -> list[str]:
    """A real DCP directory written by torch in two processes (``__0_0.distcp``, ``__1_0.distcp``,
    then ``.metadata``); returns its file names."""
    return torch_dcp.upload(client, bucket, prefix, torch_dcp.checkpoint())


def dcp_size(name: str) -> int:
    """The size of file ``name`` in the checkpoint ``write_dcp`` uploads."""
    return (torch_dcp.checkpoint() / name).stat().st_size


def safetensors(tensor_bytes: int = 32) -> bytes:
    header = json.dumps(
        {
            "__metadata__": {"format": "pt"},
            "w": {"dtype": "BF16", "shape": [tensor_bytes // 2], "data_offsets": [0, tensor_bytes]},
        }
    ).encode()
    return struct.pack("<Q", len(header)) + header + os.urandom(tensor_bytes)


def write_hf(client, bucket: str, prefix: str, step: int) -> None:
    """A Hugging Face Trainer ``checkpoint-N`` directory."""
    put(client, bucket, prefix + "model.safetensors", safetensors())
    put(client, bucket, prefix + "optimizer.pt", os.urandom(100))
    put(
        client,
        bucket,
        prefix + "trainer_state.json",
        json.dumps({"global_step": step, "log_history": []}).encode(),
    )


def write_megatron_legacy(client, bucket: str, prefix: str, tensor_parallel: int = 2) -> None:
    for rank in range(tensor_parallel):
        put(client, bucket, f"{prefix}mp_rank_{rank:02d}/model_optim_rng.pt", os.urandom(100))


def write_megatron_torch_dist(client, bucket: str, prefix: str) -> None:
    put(client, bucket, prefix + "common.pt", os.urandom(50))
    put(
        client,
        bucket,
        prefix + "metadata.json",
        b'{"sharded_backend": "torch_dist", "sharded_backend_version": 1}',
    )
    write_dcp(client, bucket, prefix)


def write_deepspeed(client, bucket: str, prefix: str, data_parallel: int = 2) -> None:
    put(client, bucket, prefix + "mp_rank_00_model_states.pt", os.urandom(100))
    for rank in range(data_parallel):
        put(client, bucket, f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", os.urandom(100))
