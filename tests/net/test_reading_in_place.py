"""A consumer waiting in ``async for`` reads its answer itself (Session.lend_socket): the
reader, at rest after handing it what it read, waits while the consumer's task reads in its
place, so a request-response loop pays no hand-over between tasks (issue 13, target 1).

What a user relies on is that nothing changes but the latency: every stream on the connection
is served while a consumer reads, a cancelled consumer loses no byte, and a consumer reading
when the connection ends hears of it at once."""

from __future__ import annotations

import functools

import outcome
import pytest
import trio
import trio.testing

import rsnet
import rsnet.net.session

from .support import demo_server, running, tls_contexts


def gated_server() -> tuple[rsnet.Server, trio.MemorySendChannel[int]]:
    """``range`` and ``gated``, whose items are the ints sent on the returned channel."""
    server = demo_server()
    send, receive = trio.open_memory_channel[int](0)

    @server.publisher("gated")
    def gated(params, ctx):
        return rsnet.from_channel(receive.clone(), nursery=ctx.nursery)

    return server, send


async def one_answer(conn) -> None:
    """A request-response round: after it, the reader is at rest and this task's next wait on
    the connection may read in its place."""
    assert [x async for x in conn.subscribe("range", {"count": 1}, prefetch=1)] == [0]


async def reading_in_place(conn) -> trio.lowlevel.Task | None:
    """The task reading in the reader's place once every task waits (None: the reader reads)."""
    await trio.testing.wait_all_tasks_blocked()
    session = conn._session
    if session._lent_to is not None:
        assert session._parked_reader is not None, "the reader waits while a consumer reads"
    return session._lent_to


async def answer_then_wait(conn, items, meanwhile):
    """In this task, one request-response round and then ``items``' next item, which it
    returns; ``meanwhile(reader)`` runs in another task once every task waits, with the task
    that reads in the reader's place then (None: the reader reads)."""

    async def watch():
        await meanwhile(await reading_in_place(conn))

    async with trio.open_nursery() as nursery:
        await one_answer(conn)
        nursery.start_soon(watch)  # (no checkpoint between the answer and the wait)
        waited = await outcome.acapture(items.__anext__)  # raised below, not in a group
    return waited.unwrap()


@pytest.mark.parametrize("transport", ["tcp", "ws"])
async def test_a_request_response_loop_reads_its_answers_in_its_own_task(transport):
    server, send = gated_server()
    async with running(server) as urls, rsnet.connect(urls[transport]) as conn:
        readers = []

        async def release(reader):
            readers.append(reader)
            await send.send(7)

        for _ in range(20):
            await one_answer(conn)
        async with conn.subscribe("gated", prefetch=1) as items:
            assert await answer_then_wait(conn, items, release) == 7
        assert readers == [trio.lowlevel.current_task()]
        assert conn._session._lent_to is None  # given back with the item
        assert conn._session._parked_reader is None


async def test_over_tls_the_reader_always_reads():
    """A cancelled TLS receive can lose bytes it decrypted (trio's SSLStream), so over tls://
    and wss:// the socket is never lent."""
    server_context, client_context = tls_contexts()
    server, send = gated_server()
    async with trio.open_nursery() as nursery:
        tcp = await nursery.start(functools.partial(server.serve_tcp, ssl_context=server_context), "127.0.0.1", 0)
        ws = await nursery.start(functools.partial(server.serve_websocket, ssl_context=server_context), "127.0.0.1", 0)
        readers = []

        async def release(reader):
            readers.append(reader)
            await send.send(7)

        for url in (f"tls://127.0.0.1:{tcp}", f"wss://127.0.0.1:{ws}/"):
            async with rsnet.connect(url, ssl_context=client_context) as conn:
                async with conn.subscribe("gated", prefetch=1) as items:
                    assert await answer_then_wait(conn, items, release) == 7
        assert readers == [None, None]
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("transport", ["tcp", "ws"])
async def test_a_consumer_reading_in_place_serves_every_other_stream(transport):
    server, send = gated_server()
    async with running(server) as urls, rsnet.connect(urls[transport]) as conn:
        others = []

        async def use_other_streams(reader):
            assert reader is not None
            # Other streams' frames arrive while the waiting consumer holds the socket: its
            # task hands them on to their consumers.
            with trio.fail_after(10):
                others.append(len([x async for x in conn.subscribe("range", {"count": 5000})]))
                others.append([x async for x in conn.subscribe("range", {"count": 3}, prefetch=1)])
            await send.send(1)

        async with conn.subscribe("gated", prefetch=1) as items:
            assert await answer_then_wait(conn, items, use_other_streams) == 1
        assert others == [5000, [0, 1, 2]]


@pytest.mark.parametrize("transport", ["tcp", "ws"])
async def test_a_consumer_cancelled_while_reading_in_place_loses_nothing(transport):
    server, send = gated_server()
    async with running(server) as urls, rsnet.connect(urls[transport]) as conn:
        session = conn._session
        readers = []

        async def note(reader):
            readers.append(reader)

        async with conn.subscribe("gated", prefetch=2) as items:
            with trio.move_on_after(0.05) as waited:
                await answer_then_wait(conn, items, note)  # nothing comes: cancelled
            assert waited.cancelled_caught
            assert readers[0] is trio.lowlevel.current_task()
            assert session._lent_to is None
            # The reader has the socket again: what arrives now is read by it.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send.send, 1)
                with trio.fail_after(5):
                    assert await items.__anext__() == 1
            await send.send(2)
            with trio.fail_after(5):
                assert await items.__anext__() == 2
        await one_answer(conn)


@pytest.mark.parametrize("transport", ["tcp", "ws"])
async def test_the_server_going_away_wakes_a_consumer_reading_in_place(transport):
    server, _ = gated_server()
    async with trio.open_nursery() as outer:
        server_scope = trio.CancelScope()

        async def serve(task_status):
            with server_scope:
                serving = server.serve_tcp if transport == "tcp" else server.serve_websocket
                await serving("127.0.0.1", 0, task_status=task_status)

        async def kill_server(reader):
            assert reader is not None
            server_scope.cancel()  # the server dies: its sockets close under the client

        port = await outer.start(serve)
        url = f"tcp://127.0.0.1:{port}" if transport == "tcp" else f"ws://127.0.0.1:{port}/"
        async with rsnet.connect(url) as conn:
            with trio.fail_after(5), pytest.raises(rsnet.ConnectionLost):
                await answer_then_wait(conn, conn.subscribe("gated"), kill_server)
            assert conn.closed


@pytest.mark.parametrize("transport", ["tcp", "ws"])
async def test_closing_the_connection_wakes_a_consumer_reading_in_place(transport):
    server, _ = gated_server()
    async with running(server) as urls, rsnet.connect(urls[transport]) as conn:

        async def close(reader):
            assert reader is not None
            await conn.aclose()  # lingers for the server's close, which the consumer reads

        with trio.fail_after(5), pytest.raises(rsnet.ConnectionLost):
            await answer_then_wait(conn, conn.subscribe("gated"), close)
        assert conn._session.closed


async def test_openings_a_consumer_cannot_hand_on_at_once_go_to_the_reader_in_order(monkeypatch):
    """Opening streams beyond a slice needs waits between slices, which are the reader's: the
    consumer gives the socket back with the rest of what it read, and the reader hands that
    on, in order, before it reads again (here every SUBSCRIBE after the first is a slice)."""
    monkeypatch.setattr(rsnet.net.session, "OPENING_SLICE", -1.0)
    client_side = rsnet.Server()  # the client's host: a registry of publishers
    client_side.add_publisher("readings", lambda params, ctx: rsnet.range_(100, params["count"]))
    server, send = gated_server()
    async with running(server) as urls, rsnet.connect(urls["tcp"], host=client_side) as conn:
        await one_answer(conn)
        (session,) = server.sessions
        results = []

        async def open_four_then_send(reader):
            assert reader is not None
            streams = [rsnet.iterate(session.publisher("readings", {"count": 3})) for _ in range(4)]

            async def read_all(stream):
                results.append([x async for x in stream])

            async with trio.open_nursery() as readers:
                for stream in streams:  # four SUBSCRIBEs to the client, then the gated item
                    readers.start_soon(read_all, stream)
                await trio.testing.wait_all_tasks_blocked()
                await send.send(5)

        async with conn.subscribe("gated", prefetch=1) as items:
            with trio.fail_after(5):
                assert await answer_then_wait(conn, items, open_four_then_send) == 5
        assert results == [[100, 101, 102]] * 4
        await one_answer(conn)


@pytest.mark.parametrize("in_place", [True, False])
async def test_closing_an_iterator_from_another_task_ends_the_wait_for_its_next_item(in_place):
    """The loop of the task waiting for the next item ends (StopAsyncIteration): at once if it
    was parked, one round trip later if it read in the reader's place (a PING's answer wakes
    it; the keepalive here is an hour, so nothing else would)."""
    server, _ = gated_server()
    async with running(server) as urls, rsnet.connect(urls["tcp"], keepalive_interval=3600) as conn:
        readers = []

        async def close_it(reader):
            readers.append(reader)
            await items.aclose()

        items = conn.subscribe("gated", prefetch=1)
        with trio.fail_after(5):
            if in_place:
                with pytest.raises(StopAsyncIteration):
                    await answer_then_wait(conn, items, close_it)
                assert readers[0] is trio.lowlevel.current_task()
            else:
                async with trio.open_nursery() as nursery:

                    async def wait_for_next():
                        with pytest.raises(StopAsyncIteration):
                            await items.__anext__()

                    nursery.start_soon(wait_for_next)
                    await close_it(await reading_in_place(conn))
                assert readers == [None]
        await one_answer(conn)


async def test_a_cancelled_consumer_hears_of_its_cancel_not_of_the_end_it_caused():
    """A stream that ended with an error while its consumer was busy elsewhere (as when the
    cancel of a scope around ``rsnet.connect`` closes the connection under it): the consumer's
    next ``__anext__`` in that cancelled scope raises Cancelled, which the scope catches."""
    async with running(demo_server()) as urls, rsnet.connect(urls["tcp"]) as conn:
        items = conn.subscribe("fail", {"n": 1}, prefetch=4)
        assert await items.__anext__() == 0
        with trio.fail_after(5):
            while not items._terminal:  # the ERROR arrives while nobody waits for it
                await trio.sleep(0.01)
        with trio.CancelScope() as scope:
            scope.cancel()
            await items.__anext__()
        assert scope.cancelled_caught
        with pytest.raises(rsnet.StreamError):  # outside it, the end is told as before
            await items.__anext__()


async def test_a_streams_rest_after_its_end_still_checks_for_cancellation():
    """Items that came with their stream's COMPLETE are handed out without waits and without
    asking the demand policy, yet a cancelled consumer stops within CANCEL_CHECK_INTERVAL."""
    from rsnet.net.iterator import CANCEL_CHECK_INTERVAL

    async with running(demo_server()) as urls, rsnet.connect(urls["tcp"]) as conn:
        taken = 0
        with trio.CancelScope() as scope:
            async with conn.subscribe("range", {"count": 1000}, prefetch=1000) as items:
                async for _ in items:
                    taken += 1
                    if taken == 1:
                        await trio.testing.wait_all_tasks_blocked()  # the rest and COMPLETE are in
                        assert items.buffered == 999
                        scope.cancel()
        assert scope.cancelled_caught
        assert taken <= 1 + CANCEL_CHECK_INTERVAL
