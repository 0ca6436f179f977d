"""``graftzoo grid FILE --ray [ADDRESS]``: each cell as a Ray task that reserves what the cell needs and runs the
cell's commands (train, then eval) as child processes on the node Ray picks. Dependencies, skip and resume work as
in the other runners (``run_grid`` decides what runs when; Ray decides where).

A cell trained in-process reserves ``run.threads`` CPUs and a GPU per trained model placed on ``cuda``; a cell trained
with ``--backend ray`` reserves nothing for its launcher (its worker groups reserve their own through placement
groups) and joins the same cluster (``ray.address``). The grid folder must be visible to every node (one machine, or
a shared file system): it is checked when the grid starts (every node leaves a mark there and reads the driver's).
Cells are spread over the nodes (Ray's SPREAD strategy); the grid says on which node each cell ran.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from graftzoo.contract.config import RaySection, RunConfig, trained_ids
from graftzoo.apps.grid.model import Cell
from graftzoo.apps.grid.run import run_cell_subprocess
from graftzoo.distributed.cluster import check_shared_dir, connect, disconnect, node_names
from graftzoo.training.planner.placement import resolve_device


def cell_resources(cfg: RunConfig) -> dict:
    """The Ray resources of a cell's launcher task, from its run config."""
    if cfg.run.backend == "ray":
        return {"num_cpus": 0, "num_gpus": 0}
    train = trained_ids(cfg)
    cuda = [s for s in cfg.pair.models if s.id in train and resolve_device(s.device).startswith("cuda")]
    return {"num_cpus": int(cfg.run.threads), "num_gpus": len(cuda)}


def cluster_workers(cfg: RunConfig) -> int:
    """Workers a cell's Ray groups start (0 for an in-process cell): sizes the private cluster."""
    if cfg.run.backend != "ray":
        return 0
    train = trained_ids(cfg)
    return sum(s.num_workers for s in cfg.pair.models if s.id in train)


def run_cell_on_node(cell: Cell, status: str, eval_options: Optional[dict], logs: Path) -> tuple:
    """``run_cell_subprocess`` on the node Ray chose; (that node's id, its answer)."""
    import ray
    return ray.get_runtime_context().get_node_id(), run_cell_subprocess(cell, status, eval_options, logs)


class RayCells:
    """The runner of ``run_grid`` on Ray: ``runner(cell, status, eval_options, logs)`` submits the cell and waits."""

    def __init__(self, address: Optional[str], cells: list, out: Path, echo=print):
        cfgs = [c.config() for c in cells]
        self.address, self.echo = address, echo
        need = max([1, *(cell_resources(c)["num_cpus"] + cluster_workers(c) for c in cfgs)])
        self.started = connect(RaySection(address=address), need)
        import ray
        self.gcs = ray.get_runtime_context().gcs_address
        try:
            check_shared_dir(Path(out), what="grid folder", key="the grid's --out")
        except BaseException:
            self.close()
            raise

    def command(self, cell: Cell) -> Cell:
        """A cell trained with ``--backend ray`` joins this grid's cluster instead of starting its own."""
        cfg = cell.config()
        if cfg.run.backend != "ray" or cfg.ray.address:
            return cell
        joined = Cell(**{**cell.__dict__, "overrides": {**cell.overrides, "ray.address": self.gcs}})
        return joined

    def __call__(self, cell: Cell, status: str, eval_options: Optional[dict], logs: Path) -> Optional[str]:
        import ray

        res = cell_resources(cell.config())
        task = ray.remote(run_cell_on_node).options(num_cpus=res["num_cpus"], num_gpus=res["num_gpus"],
                                                     max_retries=0, name=f"graftzoo-cell-{cell.name}",
                                                     scheduling_strategy="SPREAD")
        try:
            node, error = ray.get(task.remote(self.command(cell), status, eval_options, logs))
        except Exception as e:  # noqa: BLE001 - the cell fails by name; the grid goes on
            return f"its Ray task failed: {type(e).__name__}: {' '.join(str(e).split())[:400]}"
        self.echo(f"  {cell.name} ran on node {node_names().get(node, node)}")
        return error

    def close(self) -> None:
        disconnect(self.started)
