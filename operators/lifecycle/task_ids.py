"""The lifecycle DAG's task ids: ``dag.py`` names its tasks by them, and the UI plugin's run view reads
those tasks' XComs and rendered fields by them (``trainops.plugins.runs``)."""

PREFLIGHT = "preflight"
RESERVE_RUN_PATH = "reserve_run_path"
HEALTH_GATE = "health_gate"
CLAIM_NODES = "claim_nodes"
FABRIC_READY = "fabric_ready"
TRAIN = "train"
VERIFY_CHECKPOINT = "verify_checkpoint"
RETURN_CAPACITY = "return_capacity"
