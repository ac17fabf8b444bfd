"""The scheduling plugin's pure logic: tenant policies (`tenants`), the rules the cluster
policies apply and the aged priority weight (`rules`), the fleet state and decisions
(`model`), a running job's live state from its events (`live`) and the fleet state from
Airflow's rows (`snapshot`), the preemption victim choice (`victims`, its set search in
`victim_sets`), the preemption request file (`request`), and the fleet simulation that
compares policies (`fleet_sim`, on a synthetic fleet from `fleet_workload` or on
recorded jobs through `recorded`). No Airflow, SQL or torch (its `ruff.toml`); plugin/
and the controller are the glue."""
