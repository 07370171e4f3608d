"""The data path of an attempt: a small process of its own that carries one attempt
while the loop may come and go (DESIGN.md: "data path", one name in code, docs, files
and process titles; containerd calls its like a shim).

It is the harness's parent and reaper (a child subreaper), holds the attempt's gateway
listener, records the harness's exit status and writes the attempt's request evidence
and meter into the state dir itself. It decides nothing: the watchdog, verdicts,
retries and quarantine stay in the loop, which talks to it over a Unix socket in the
attempt's own directory (``wire``) and re-attaches to it after a crash, a pause or an
upgrade. ``process`` is the data path itself; ``messages`` what is said on the channel,
``wire`` how; ``client`` is the loop's side (``DataPath``, the ``Launcher`` with its
``forkserver``).
"""
