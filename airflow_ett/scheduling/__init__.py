"""The scheduling plugin's pure logic: tenant policies (`tenants`), the fleet state and
decisions (`model`), and the preemption victim choice (`victims`). No Airflow, SQL or
torch (its `ruff.toml`); plugin/ and the controller are the glue."""
