"""The inference endpoint: OpenAI Chat Completions, Anthropic Messages and /v1/models over the training server.

tinker-cookbook's capture proxy answers the two chat APIs (rendering, parsing, tools, the capture store);
rlcli composes it (app.py) and adds what a served champion needs: names that resolve per request (the base
model, a checkpoint, a loop's champion: models.py), keys and tenants, `n`, client stops, one error shape per
API, the answering weights in a header, every exchange and its feedback recorded for the loop (capture.py).
The start-up and the processes (the endpoint, the capture store daemon) are in commands.py.
"""
