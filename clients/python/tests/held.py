"""Giving up a call that the test bed holds back (`hold-next-call`), for the clean-up tests."""

import asyncio

import pytest


async def give_up_held_call(testbed, start):
    """Starts `start()` (a coroutine function) with the test bed holding its call back, cancels
    it once held, and returns once a later call on that connection (the SDK's clean-up) was
    answered after the held call was passed on to lockd."""
    testbed.command("hold-next-call")
    task = asyncio.create_task(start())
    await asyncio.to_thread(testbed.command, "wait-held")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.to_thread(testbed.command, "wait-held-answered")
