"""The scheduling plugin's pure logic: tenant policies (`tenants`), the rules the cluster
policies apply and the aged priority weight (`rules`), the fleet state and decisions
(`model`), a running job's live state from its events (`live`) and the fleet state from
Airflow's rows (`snapshot`), the preemption victim choice (`victims`, its set search in
`victim_sets`), and the fleet simulation that compares policies (`fleet_sim`, on a
synthetic fleet from `fleet_workload` or on recorded jobs through `recorded`). The
preemption request file is the leave protocol's (`airflow_ett.protocol.request`). No
Airflow, SQL or torch, and of the package only ett/, rollup/, protocol/request,
_untrusted and settings (its `ruff.toml`); plugin/ and the controller are the glue.
The package imports no module eagerly: protocol/ imports `limits` and `model` alone."""
