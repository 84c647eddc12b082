"""Party B's HTTP API (FastAPI), in the layout of the FastAPI full-stack template.

    main.py        create_app(settings): database, labels, service, routes, middleware
    routes/        one module per resource: ops, runs, alignment, steps, serving
    contract.py    what each route consumes and which problems it answers (ContractRoute)
    deps.py        the caller (bearer token), the service, worker threads, msgpack responses
    problems.py    every error rendered as problem+json
    middleware.py  body size limit (413) and per-route request metrics
    lifecycle.py   starting / serving / draining; requests and steps in flight (503 when draining)
    readiness.py   GET /readyz's database check (liveness, /healthz, asks nothing)

Routes only translate HTTP to calls of ``party_b.service.Service``.
"""

from party_b.api.main import create_app

__all__ = ["create_app"]
