"""Exactly once across a kill -9 of a Cell's owner (runs after test_cluster:
it kills a node)."""

import os
import signal
import threading
import time
import unittest

from cellfleet import Client, RetryPolicy

from common import config, nodes


class KillTest(unittest.TestCase):
    def test_commands_across_an_owner_kill_9_apply_exactly_once(self):
        policy = RetryPolicy(attempts=40, budget_s=40, attempt_timeout_s=2)
        client = Client(config(), policy=policy)
        cells = [f"py-kill-{i}" for i in range(6)]
        owners = {}
        for cell in cells:
            owners[cell] = client.execute("log", cell, "append", {"tag": "first"}).served_by
        victims = [n for n in nodes() if n != "n1" and n in owners.values()]
        victim = victims[0] if victims else "n2"
        acked = {cell: ["first"] for cell in cells}
        retried = []
        failures = []

        def writer(cell):
            for n in range(25):
                tag = f"{cell}-{n}"
                try:
                    executed = client.execute("log", cell, "append", {"tag": tag})
                except Exception as error:  # the test fails below with it
                    failures.append(f"{cell} #{n}: {error!r}")
                    return
                self.assertTrue(executed.applied, executed)
                acked[cell].append(tag)
                if executed.attempts > 1:
                    retried.append(tag)
                time.sleep(0.02)

        threads = [threading.Thread(target=writer, args=(cell,)) for cell in cells]
        for thread in threads:
            thread.start()
        time.sleep(0.4)
        os.kill(nodes()[victim][0], signal.SIGKILL)
        for thread in threads:
            thread.join()
        self.assertEqual(failures, [])
        self.assertTrue(retried, "no command was retried: the kill missed the load")
        for cell in cells:
            rows = client.query("log", cell, "count").value["rows"]
            counts = {tag: n for tag, n in rows}
            self.assertEqual(counts, {tag: 1 for tag in acked[cell]}, cell)
        client.close()


if __name__ == "__main__":
    unittest.main()
