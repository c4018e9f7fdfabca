"""The standalone participant simulator keeps what survived out of the cyclic collector's reach,
so a full collection over its growing records never pauses it (an arrival stamped after a pause
would look like a request the platform sent late)."""

from __future__ import annotations

import gc
import threading
import time

from aml_participant_simulator.__main__ import freeze_survivors


def test_survivors_are_frozen_until_the_loop_is_stopped() -> None:
    gc.unfreeze()
    stop = threading.Event()
    records = [{"seq": i, "body": b"x" * 10} for i in range(1000)]
    thread = threading.Thread(target=freeze_survivors, args=(stop,), daemon=True)
    try:
        thread.start()
        deadline = time.monotonic() + 10
        while gc.get_freeze_count() < len(records) and time.monotonic() < deadline:
            time.sleep(0.01)
        # Everything alive when the loop ran is in the permanent generation, the records too.
        assert gc.get_freeze_count() >= len(records)
        assert not any(record is obj for obj in gc.get_objects() for record in records[:1])
    finally:
        stop.set()
        thread.join(timeout=5)
        gc.unfreeze()
    assert not thread.is_alive()
