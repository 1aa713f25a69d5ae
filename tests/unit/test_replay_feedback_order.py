"""The replay's label posts: every body sent once, each user's in event order, whatever the
pool's threads finish first."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from jobs.replay import post_feedback


class _SlowClient:
    """Records each post as it lands; a post takes a random few milliseconds, so posts sent
    from several threads land in another order than they were sent."""

    def __init__(self, seed: int):
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.landed: list[dict] = []

    def post(self, path: str, body: dict) -> dict:
        assert path == "/feedback"
        with self._lock:
            delay = self._rng.uniform(0.0, 0.004)
        time.sleep(delay)
        with self._lock:
            self.landed.append(body)
        return {"ok": True}


def test_each_users_labels_land_in_event_order_and_none_is_lost() -> None:
    rng = random.Random(7)
    bodies = [{"user_id": rng.randrange(5), "items": [rng.randrange(50)], "labels": [[1]],
               "now": float(t)} for t in range(120)]
    for seed in range(3):
        client = _SlowClient(seed)
        with ThreadPoolExecutor(4) as pool:
            post_feedback(client, pool, bodies)
        assert sorted(map(id, client.landed)) == sorted(map(id, bodies))
        for user in {b["user_id"] for b in bodies}:
            sent = [b["now"] for b in bodies if b["user_id"] == user]
            got = [b["now"] for b in client.landed if b["user_id"] == user]
            assert got == sent, f"user {user}: labels landed as {got}, sent as {sent}"
        # the users ran in parallel: the landing order as a whole is not the sending order
        # (which one post per body through the pool would also fail to keep per user)
        assert [b["now"] for b in client.landed] != [b["now"] for b in bodies]
