"""Party B's operator side: ``fedlite-b`` and what it runs. Nothing here is on a request's
path; the app (``party_b.api``, ``party_b.service``) never imports it.

    cli.py         fedlite-b: parser and main(argv)
    admin.py       token and database commands
    runs_admin.py  fedlite-b runs list | show | delete
    launch.py      fedlite-b serve as a child process, waited for
    background.py  party B over HTTP in a thread of this process (a notebook, a test)
    preflight.py   start-up checks: TLS files, the label table
    maintenance.py the SQLite file created 0600, online backup
    logs.py        one log format for party B and uvicorn
    export.py      fedlite-b export
"""
