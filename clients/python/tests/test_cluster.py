"""The Python client against real node processes (started by
crates/cellfleet/tests/python_package.rs)."""

import asyncio
import dataclasses
import os
import random
import time
import unittest

import grpc

from cellfleet import (AsyncClient, Client, ConfigError, Refused, RetryPolicy,
                       TransportError, UnknownOutcome, Unreachable, after_failure)
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
        stats = self.client.node_stats()
        self.assertEqual([n.node_id for n in stats.nodes], sorted(nodes()))
        self.assertEqual(list(stats.unreachable), [])
        owner_stats = next(n for n in stats.nodes if n.node_id == put.served_by)
        self.assertGreaterEqual(owner_stats.commands_total, 1)

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

    def test_a_cluster_nobody_listens_on_is_a_definite_failure(self):
        # Nothing listens on these ports: every attempt is never sent, so a
        # command is definitely not applied (not "unknown"), and the call
        # ends once each configured node was unreachable, within the budget.
        nowhere = dataclasses.replace(config(), endpoints=["127.0.0.1:1", "127.0.0.1:2"])
        with Client(nowhere) as client:
            with self.assertRaises(Unreachable) as failed:
                client.execute("kv", "py-6", "put", {"key": "k", "value": 1})
            self.assertNotIsInstance(failed.exception, UnknownOutcome)
            self.assertFalse(failed.exception.maybe_applied)
            self.assertEqual(failed.exception.name, "UNREACHABLE")
            self.assertIn(failed.exception.endpoint, nowhere.endpoints)
            with self.assertRaises(Unreachable):
                client.query("kv", "py-6", "get", {"key": "k"})

        async def run():
            async with AsyncClient(nowhere) as client:
                await client.execute("kv", "py-6", "put", {"key": "k", "value": 1})
        with self.assertRaises(Unreachable):
            asyncio.run(run())

    def test_two_dead_nodes_of_three_do_not_end_the_retries(self):
        # The live node hints at a dead one; the round robin then lands on
        # the other dead one and the first again: retries go on while the
        # third node still answers, and end once all three were unreachable.
        three = dataclasses.replace(config(), endpoints=["a:1", "b:1", "c:1"])
        with Client(three) as client:
            core = client._core
            started = time.monotonic()
            dead = Unreachable("a:1", 0.1)
            found = set()
            for target in ["a:1", "b:1", "a:1", "b:1"]:
                found.add(target)
                step, _ = core.step(1, started, False, dead, True, found)
                self.assertEqual(step, RETRY, found)
            found.add("c:1")
            self.assertEqual(core.step(1, started, False, dead, True, found)[0], FAIL)
            self.assertEqual(core.step(1, started, True, dead, True, found)[0], RESOLVE)

    def test_an_unreachable_node_is_skipped_for_a_live_one(self):
        # The first endpoint is dead, the rest live: the call is served.
        endpoints = ["127.0.0.1:1"] + [endpoint for _, endpoint in nodes().values()]
        with Client(dataclasses.replace(config(), endpoints=endpoints),
                    owner_routing=False) as client:
            for attempt in range(3):
                put = client.execute("kv", "py-7", "put", {"key": "k", "value": attempt})
                self.assertTrue(put.applied, put)

    def test_admin_calls(self):
        put = self.client.execute("kv", "py-8", "put", {"key": "k", "value": 1})
        described = self.client.describe_cell("kv", "py-8")
        self.assertEqual(described.summary.owner_node_id, put.served_by)
        self.assertEqual(described.summary.kind, "kv")
        self.assertEqual(described.summary.epoch, put.receipt.epoch)
        # The root holds the checkpointed state; newer records are in the
        # owner's node log, which the root then points at.
        self.assertLessEqual(described.summary.txid, put.receipt.txid)
        if described.summary.txid < put.receipt.txid:
            self.assertTrue(described.HasField("log"), described)
        with self.assertRaises(TransportError) as missing:
            self.client.describe_cell("kv", "py-never-created")
        self.assertEqual(missing.exception.name, "NOT_FOUND")
        keys, token = set(), ""
        for _ in range(1000):
            page = self.client.cells(owner_node_id=put.served_by, limit=2, page_token=token)
            self.assertLessEqual(len(page.cells), 2)
            keys.update(cell.key for cell in page.cells)
            token = page.next_page_token
            if not token:
                break
        self.assertIn(b"py-8", keys)
        with self.assertRaises(ConfigError):
            self.client.drain("no-such-node")
        limited = dataclasses.replace(config(), key_id="limited",
                                      signing_key=config().signing_key.parent / "limited.ed25519.pem")
        with Client(limited) as client:
            with self.assertRaises(Refused) as refused:
                client.drain(put.served_by)
        self.assertEqual(refused.exception.name, "UNAUTHORIZED")

        async def run():
            async with AsyncClient(config()) as client:
                return (await client.leases(), await client.describe_cell("kv", "py-8"),
                        await client.node_stats())
        leases, described, stats = asyncio.run(run())
        self.assertEqual({lease.node_id for lease in leases}, set(nodes()))
        self.assertEqual([n.node_id for n in stats.nodes], sorted(nodes()))
        self.assertEqual(described.summary.owner_node_id, put.served_by)

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
