"""The ETT pages inside the Airflow UI: a FastAPI app mounted at `/ett` by the plugin.

What is where (docs/decisions/0012-ui-pages-and-auth.md says why):

- `views`: the plugin's `external_views` ("ETT" in the navigation, "ETT breakdown" on each
  DAG run) and the URL prefix. Light: it is imported in every Airflow process.
- `app`: the app factory, built only when Airflow's API server reads the plugin's
  `fastapi_apps` (the plugin's lazy descriptor); the static files and the OpenAPI schema.
- `access`: who may see what, through Airflow's own FastAPI security dependencies and auth
  manager: every route needs a user, the fleet is computed over the DAGs the user may read,
  a run page needs read access to that DAG's runs.
- `data`: the figures behind both kinds of route, from the ETT store (rollup rows, a run's
  events); `models`: their JSON form, which is also the OpenAPI schema.
- `api`: the JSON routes (`/ett/api/v1/...`); `pages`: the HTML pages (`/ett/`,
  `/ett/runs/<dag_id>/<run_id>`), rendered on the server from the same models, with the
  report's plotly figures (`airflow_ett.report.html`) drawn by the bundled plotly.js.

Only `views` may be imported at plugin load: the rest pulls in FastAPI, Airflow's security
module and the store, which the scheduler and the workers never need.
"""
