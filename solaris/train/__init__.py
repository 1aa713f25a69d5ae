"""Training: the FM and its pair encoder (the teacher), the VMs and their residual corrections,
and the artifacts that serving loads."""
