"""The cluster conventions of DESIGN §2: label, taint and annotation keys shared by every part."""

MODE_TAINT = "trainops.io/mode"
MODE_INFERENCE = "inference"
MODE_TRAINING = "training"

QUARANTINE_TAINT = "trainops.io/quarantine"
HEALTH_LABEL = "trainops.io/health"
HEALTH_QUARANTINED = "quarantined"
# The node probe's verdict on the node (compact); its full report lives in a ConfigMap per node
# in HEALTH_NAMESPACE (see trainops.health.published).
HEALTH_SUMMARY_ANNOTATION = "trainops.io/health-summary"
HEALTH_NAMESPACE = "trainops-system"
# Why a node was quarantined (evidence as JSON).  Kept apart from the probe's report, which the
# probe rewrites on every publish and would otherwise erase the evidence.
QUARANTINE_EVIDENCE_ANNOTATION = "trainops.io/quarantine-evidence"
GPU_HEALTHY_CONDITION = "GPUHealthy"

CLAIMED_BY_ANNOTATION = "trainops.io/claimed-by"

GPU_POOL_LABEL = "trainops.io/gpu-pool"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"  # set by NVIDIA GPU Feature Discovery
IB_PORT_COUNT_LABEL = "trainops.io/ib-port-count"  # InfiniBand ports the node has (set by the admin or NFD)
# The fabric a node's pool trains over (a name in the gate's fabrics; "none": the pool needs no RDMA).
FABRIC_LABEL = "trainops.io/fabric"

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
