"""Honest load: the environment's QUERY steps, many sessions on the OpenEnv server, many visitors on a dashboard that
is training, and what the dashboard costs a run."""
