"""A worker's own threads carry their names in the OS (streams/runtime/thread_names.py)."""

from __future__ import annotations

import threading
from pathlib import Path

from streams.runtime.thread_names import OS_NAME_MAX, name_os_thread


def os_name_of_a_thread_named(name: str) -> tuple[bool, str]:
    seen: list[tuple[bool, str]] = []

    def run() -> None:
        named = name_os_thread(name)
        seen.append((named, Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return seen[0]


def test_a_thread_is_named_in_the_os_and_only_itself():
    main_before = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text()
    assert os_name_of_a_thread_named("ms-outputs") == (True, "ms-outputs")
    assert Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text() == main_before


def test_a_long_name_keeps_its_first_15_bytes_even_mid_character():
    assert os_name_of_a_thread_named("ms-a-much-longer-name") == (True, "ms-a-much-longer-name"[:OS_NAME_MAX])
    named, name = os_name_of_a_thread_named("ms-consumer-ééé")  # "é" is 2 bytes: byte 15 falls inside one
    assert named and name == "ms-consumer-é"
