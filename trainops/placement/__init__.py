"""Placement that follows the fabric: which nodes a run (and its spares) takes, as Kueue's Topology
Aware Scheduling would place it.  ``request`` says what a run asks for (``TopologyRequest``: a level
of the cluster's topology, required or preferred); ``place`` is the pure choice over nodes, their
labels and their free capacity; ``scheduling`` is where a pod may run at all, as kube-scheduler decides it
(taints against tolerations, node selector and required node affinity)."""
