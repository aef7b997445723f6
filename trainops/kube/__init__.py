"""The one way trainops reaches Kubernetes: clients, the retry policy, guarded edits, node reads and writes."""
