"""The Python client against real node processes (started by
crates/cellfleet/tests/python_package.rs)."""

import asyncio
import dataclasses
import os
import random
import unittest

import grpc

from cellfleet import (AsyncClient, Client, Refused, RetryPolicy, TransportError,
                       after_failure)
from cellfleet.client import FAIL, RESOLVE, RETRY

from common import config, nodes


class ClusterTest(unittest.TestCase):
    def setUp(self):
        self.client = Client(config())

    def tearDown(self):
        self.client.close()

    def test_execute_then_read_your_writes(self):
        put = self.client.execute("kv", "py-1", "put", {"key": "name", "value": "Ada"})
        self.assertTrue(put.applied, put)
        self.assertIsNotNone(put.receipt)
        self.assertGreater(put.receipt.txid, 0)
        got = self.client.query("kv", "py-1", "get", {"key": "name"}, after=put.receipt)
        self.assertEqual(got.value, {"type": "value", "value": "Ada"}, got)
        self.assertEqual(got.served_by, put.served_by)

    def test_a_rejection_is_a_stored_outcome_and_a_retry_returns_it(self):
        command_id = os.urandom(16)
        first = self.client.execute("kv", "py-2", "no_such_command", {}, command_id=command_id)
        self.assertFalse(first.applied)
        self.assertEqual(first.rejection[0], "UNKNOWN_COMMAND", first)
        again = self.client.execute("kv", "py-2", "no_such_command", {}, command_id=command_id)
        self.assertTrue(again.duplicate, again)
        self.assertEqual(again.rejection, first.rejection)
        resolved = self.client.resolve("kv", "py-2", command_id, first.expires_at_ms)
        self.assertEqual(resolved.state, "COMMITTED", resolved)

    def test_the_owner_is_learnt_from_the_answer(self):
        put = self.client.execute("kv", "py-3", "put", {"key": "k", "value": 1})
        owner = nodes()[put.served_by][1]
        self.assertEqual(self.client.cached_owner("kv", "py-3"), owner)
        leases = {lease.node_id for lease in self.client.leases()}
        self.assertEqual(leases, set(nodes()))

    def test_errors_are_typed(self):
        limited = dataclasses.replace(config(), key_id="limited",
                                      signing_key=config().signing_key.parent / "limited.ed25519.pem")
        with Client(limited) as client:
            with self.assertRaises(Refused) as refused:
                client.execute("kv", "py-4", "put", {"key": "k", "value": 1})
        self.assertEqual(refused.exception.name, "UNAUTHORIZED")
        self.assertFalse(refused.exception.retry_safe)
        nowhere = dataclasses.replace(config(), endpoints=["127.0.0.1:1"])
        with Client(nowhere, policy=RetryPolicy(attempts=1)) as client:
            with self.assertRaises(TransportError):
                client.query("kv", "py-4", "get", {"key": "k"})

    def test_asyncio_client(self):
        async def run():
            async with AsyncClient(config()) as client:
                put = await client.execute("kv", "py-5", "put", {"key": "a", "value": [1, 2]})
                got = await client.query("kv", "py-5", "get", {"key": "a"}, after=put.receipt)
                return put, got
        put, got = asyncio.run(run())
        self.assertTrue(put.applied)
        self.assertEqual(got.value, {"type": "value", "value": [1, 2]}, got)


class RetryRuleTest(unittest.TestCase):
    def test_a_command_in_doubt_is_never_a_definite_failure(self):
        rng = random.Random(7)
        for _ in range(20_000):
            policy = RetryPolicy(attempts=rng.randint(1, 12), budget_s=rng.uniform(0, 60),
                                 backoff_min_s=rng.uniform(0.001, 0.2),
                                 backoff_max_s=rng.uniform(0.2, 5))
            error = Refused(rng.randint(0, 23), grpc.StatusCode.UNAVAILABLE,
                            "x", rng.random() < 0.5, rng.choice([0, 0, 500, 3000]), "")
            attempt, elapsed, in_doubt = rng.randint(1, 20), rng.uniform(0, 90), rng.random() < 0.5
            step, pause = after_failure(policy, attempt, elapsed, in_doubt, error, command=True)
            if in_doubt or error.maybe_applied:
                self.assertNotEqual(step, FAIL)
            else:
                self.assertNotEqual(step, RESOLVE)
            if step == RETRY:
                self.assertTrue(error.retry_safe)
                self.assertLess(attempt, policy.attempts)
                self.assertLess(elapsed + pause, policy.budget_s)
                self.assertGreaterEqual(pause, error.retry_after_ms / 1000)
            read, _ = after_failure(policy, attempt, elapsed, in_doubt, error, command=False)
            self.assertNotEqual(read, RESOLVE)


if __name__ == "__main__":
    unittest.main()
