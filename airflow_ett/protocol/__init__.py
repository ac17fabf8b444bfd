"""The leave protocol: the public contract between the train task and any trainer.

docs/trainer-protocol.md is its prose. The modules, one job each:
`env` (what the task gives a trainer process), `exits` (exit codes, the exit record,
what an exit means), `request` (the preemption request file and its operations),
`states` (the request's life as one typed state machine, and every party's decision),
`leave` (the trainer's side: SIGTERM, the claim at a save, the first step).

Nothing here imports Airflow, SQL or torch: a trainer process, the train task, the
preemption controller and the adapters all use it. The package imports no module
eagerly, so a trainer pays only for what it uses.
"""
