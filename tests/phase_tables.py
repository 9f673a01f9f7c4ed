"""Phase tables built step by step, whose critical path and waiting are
known by construction (``scale`` multiplies the BASE phases, as a
larger batch would; shared by the critical path, timeline, what-if and
diff tests)."""

import pandas as pd

MS = 1_000_000
BASE = {"data_load": 5, "forward": 10, "backward": 20}


def constructed(
    world=4,
    steps=20,
    extra=None,
    comm_ms=3,
    optimizer_ms=2,
    exposed=True,
    run_id="r1",
    origin=1_700_000_000_000_000_000,
    nodes=1,
    node_clock_ns=0,
    scale=1.0,
):
    """A data-parallel run built step by step. Each rank does data_load,
    forward, backward (BASE ms plus ``extra(rank, step)``: {phase: ms}),
    then joins: with ``exposed`` a grad_comm phase from its arrival to the
    last arrival plus ``comm_ms`` (Horovod), else a collective on a comm
    location from its last hand-over to that same end, backward returning
    there (DDP with a trace). Then optimizer. Clocks are epoch ns, so that
    a float anywhere would lose them. With ``nodes``, ranks are spread over
    nodes in blocks, and node n's clock reads ``n * node_clock_ns`` ahead."""
    per_node = -(-world // nodes)
    rows, clock = [], origin

    def add(rank, step, phase, start, end, location="Master thread", collective=None):
        ahead = rank // per_node * node_clock_ns
        rows.append(
            {
                "run_id": run_id,
                "rank": rank,
                "node": f"n{rank // per_node}",
                "step": step,
                "epoch": 1,
                "phase": phase,
                "start_ns": start + ahead,
                "end_ns": end + ahead,
                "dur_ns": end - start,
                "location": location,
                "collective": collective,
                "bytes": 4_000_000 if collective else None,
                "source": "test",
            }
        )

    for step in range(steps):
        arrive, local = {}, {}
        for rank in range(world):
            durs = {p: int(round(ms * scale * MS)) for p, ms in BASE.items()}
            for phase, ms in ((extra or (lambda r, s: {}))(rank, step)).items():
                durs[phase] += int(round(ms * MS))
            local[rank] = durs
            arrive[rank] = clock + sum(durs.values())
        done = max(arrive.values()) + int(round(comm_ms * MS))
        for rank in range(world):
            t = clock
            for phase in BASE:
                end = t + local[rank][phase]
                if phase == "backward" and not exposed:
                    end = done  # DDP: backward returns when the all-reduce does
                    add(rank, step, "grad_comm", arrive[rank], done, "comm 0", "allreduce")
                add(rank, step, phase, t, end)
                t = end
            if exposed:
                add(rank, step, "grad_comm", t, done)
            add(rank, step, "optimizer", done, done + optimizer_ms * MS)
        clock = done + optimizer_ms * MS
    return pd.DataFrame(rows)


def run_table(run_id="r1", framework="horovod-torch", world=4, **more):
    return pd.DataFrame(
        [
            {
                "run_id": run_id,
                "status": "ok",
                "framework": framework,
                "world_size": world,
                "batch_size": 64,
                "warmup_steps": 0,
                "setting": "batch_size 64",
                **more,
            }
        ]
    )
