"""Reports of the fleet rollup: text (a terminal table), JSON, CSV and HTML with charts,
rendered from stored `DayRollup`s by pure functions; `timeline` builds the attempt
timeline of one run that the HTML report and the run page draw. No store import: the
rows, and the events of the runs drawn, come from the callers (its `ruff.toml`)."""
