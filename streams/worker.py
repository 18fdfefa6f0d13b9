"""`memstream worker`: one pipeline worker process (a Faust worker running the memstream app).

Several workers on one host run side by side when each has its own web port and data dir;
they share the work through the Kafka consumer group named by MEMSTREAM_APP_ID.
"""

from __future__ import annotations

from pathlib import Path

from .settings import Settings
from .topics import TopicError, missing_topics


def run(settings: Settings) -> int:
    missing = missing_topics(settings)
    if missing:
        raise TopicError(
            f"{len(missing)} catalog topic(s) missing ({', '.join(missing[:3])}…); run `memstream topics apply` first"
        )
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    from faust.worker import Worker

    from .app import create_app

    app = create_app(settings)
    worker = Worker(app, loglevel=settings.log_level, quiet=True)
    worker.execute_from_commandline()  # exits the process when the worker stops
    return 0
