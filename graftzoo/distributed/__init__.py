"""Scale-out: models in Ray worker groups (backend), FSDP2 within a group (fsdp), the cluster (cluster)."""
