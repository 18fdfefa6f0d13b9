"""The worker's own threads carry their names in the operating system too (what `top -H`,
`ps -L`, /proc/<pid>/task/<tid>/comm and profilers show), so their CPU can be told apart:
`ms-consumer` (Faust's consumer thread: aiokafka's fetches), `ms-outputs` (the output
producer's delivery reports), `ms-probe` (the registry and broker probe), `ms-standby` (the
standby replicas' applier), `ms-input` (the inputs fetched by librdkafka: MEMSTREAM_INPUT_FETCH).
librdkafka names its own (`rdk:…`), RocksDB its own."""

from __future__ import annotations

import threading

OS_NAME_MAX = 15  #: Linux keeps a thread name's first 15 bytes


def name_os_thread(name: str) -> bool:
    """Give the calling thread `name` in the OS (Linux only; elsewhere, or when /proc refuses,
    nothing happens). True when it was named."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write(name.encode()[:OS_NAME_MAX].decode(errors="ignore"))
        return True
    except OSError:
        return False
