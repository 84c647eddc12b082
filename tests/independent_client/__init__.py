"""A party A written from the documents alone: docs/PROTOCOL.md (sections 1-4, 9 and 10) and
the OpenAPI document's JSON bodies. It imports nothing of this repository (no ``shared``,
``party_a``, ``api_schemas``): only the standard library, numpy, httpx and msgpack, which
tests/contract/test_independent_client.py checks. Where writing it needed something the
documents did not say, the documents were fixed.

``derived``: aligned keys, the split, the ``shuffle`` schedule and digests (section 9).
``messages``: the msgpack messages and codeword bit packing (sections 1-4).
``client``: the HTTP binding (section 10) and a training loop with a numpy bottom model.
``parties``: one feature party of a run with several (section 12), on its own routes.
"""
