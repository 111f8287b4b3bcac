"""Server and client over real loopback TCP and WebSocket connections."""

from __future__ import annotations

import contextlib
import dataclasses
import socket

import pydantic
import pytest
import trio
import trio.testing

import rsnet
import rsnet.sync
from rsnet import ops
from rsnet.errors import HandshakeError
from rsnet.protocol import ErrorCode

from .support import demo_server, endless_server, running

TRANSPORTS = ["tcp", "ws"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_subscribe_receives_all_items_then_completes(transport):
    async with running(demo_server()) as urls, rsnet.connect(urls[transport]) as conn:
        assert [x async for x in conn.subscribe("range", {"start": 5, "count": 1000}, prefetch=64)] == list(
            range(5, 1005)
        )


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_remote_error_arrives_with_code_message_and_data_after_the_items(transport):
    async with running(demo_server()) as urls, rsnet.connect(urls[transport]) as conn:
        seen = []
        with pytest.raises(rsnet.StreamError) as caught:
            async for item in conn.subscribe("fail", {"n": 3}):
                seen.append(item)
        assert seen == [0, 1, 2]
        assert caught.value.code == ErrorCode.APPLICATION_ERROR
        assert "failed on purpose" in caught.value.message
        assert caught.value.data == {"type": "RuntimeError"}


def _failing_after_three():
    yield from range(3)
    raise KeyError("source failed")


@pytest.mark.parametrize("prefetch", [1, 3, 4, 5, None])
@pytest.mark.parametrize(
    ("source", "failure"),
    [(lambda: range(4), None), (_failing_after_three, "source failed"), (lambda: [0, 1, 2, None], "rule 2.13")],
)
async def test_an_iterable_publishers_items_and_end_arrive_whatever_its_first_window_holds(source, failure, prefetch):
    """The session takes the first window of a source whose items are at hand in one call
    (synchronous fusion): a stream ending inside that window, at its edge or after it (the
    window is 4 items: 4 MiB over the client's 1 MiB max_frame_size) brings the same items
    and the same end, a completion or an error (rules 1.4, 1.5, 2.13)."""
    server = rsnet.Server()
    server.add_publisher("numbers", lambda params, ctx: rsnet.from_iterable(source()))
    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        items = []
        with pytest.raises(rsnet.StreamError) if failure else contextlib.nullcontext() as caught:
            async for item in conn.subscribe("numbers", prefetch=prefetch):
                items.append(item)
        (session,) = server.sessions
        assert not session._outbound  # ended on the server too
    assert items == ([0, 1, 2, 3] if failure is None else [0, 1, 2])
    if failure:
        assert caught.value.code == ErrorCode.APPLICATION_ERROR
        assert failure in caught.value.message


async def test_a_publishers_factory_gets_its_streams_context_frozen():
    """StreamContext, made for every stream a peer opens (its own __init__, through the slots):
    each field holds what it names, and it stays a frozen dataclass."""
    contexts = []
    server = rsnet.Server()

    @server.publisher("context")
    def context(params, ctx):
        contexts.append(ctx)
        return rsnet.just(ctx.peer)

    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        (peer,) = [item async for item in conn.subscribe("context")]
        (session,) = server.sessions
    (ctx,) = contexts
    assert (ctx.nursery, ctx.peer, ctx.principal, ctx.metadata) == (session.nursery, session.peer, None, {})
    assert peer == session.peer and peer.startswith("127.0.0.1:")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.peer = "elsewhere"
    assert dataclasses.replace(ctx, peer="elsewhere") == rsnet.StreamContext(session.nursery, "elsewhere", None, {})


async def test_application_error_codes_and_data_cross_unchanged():
    server = rsnet.Server()

    @server.publisher("custom")
    def custom(params, ctx):
        return rsnet.error(rsnet.StreamError(4711, "quota exceeded", {"limit": 10}))

    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        with pytest.raises(rsnet.StreamError) as caught:
            async for _ in conn.subscribe("custom"):
                pass
    assert (caught.value.code, caught.value.message, caught.value.data) == (4711, "quota exceeded", {"limit": 10})


async def test_unknown_publisher_is_a_stream_error_and_the_connection_lives_on():
    async with running(demo_server()) as urls, rsnet.connect(urls["tcp"]) as conn:
        with pytest.raises(rsnet.StreamError) as caught:
            async for _ in conn.subscribe("no-such-thing"):
                pass
        assert caught.value.code == ErrorCode.UNKNOWN_PUBLISHER
        assert [x async for x in conn.subscribe("range", {"count": 3})] == [0, 1, 2]


class RangeParams(pydantic.BaseModel):
    start: int = 0
    count: pydantic.conint(ge=0, le=1000)


async def test_parameters_are_validated_and_bad_ones_are_rejected_with_the_field_named():
    server = rsnet.Server()

    @server.publisher("range", params=RangeParams)
    def range_(params: RangeParams, ctx):
        return rsnet.range_(params.start, params.count)

    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        assert [x async for x in conn.subscribe("range", {"start": 1, "count": 2})] == [1, 2]
        with pytest.raises(rsnet.StreamError) as caught:
            async for _ in conn.subscribe("range", {"count": 10_000}):
                pass
        assert caught.value.code == ErrorCode.REJECTED
        assert "count" in caught.value.message
        assert caught.value.data[0]["field"] == "count"
        assert [x async for x in conn.subscribe("range", {"count": 1})] == [0]
        # A parameter the model does not name is refused, as the broker refuses one: a misspelt
        # "start" must not quietly mean 0.
        with pytest.raises(rsnet.StreamError) as caught:
            async for _ in conn.subscribe("range", {"strat": 5, "count": 1}):
                pass
        assert caught.value.code == ErrorCode.REJECTED
        assert caught.value.data == [{"field": "strat", "error": "Extra inputs are not permitted"}]


async def test_a_params_model_that_chooses_extra_keeps_its_choice():
    class Lenient(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="ignore")
        count: int = 1

    server = rsnet.Server()

    @server.publisher("lenient", params=Lenient)
    def lenient(params: Lenient, ctx):
        assert isinstance(params, Lenient)
        return rsnet.range_(0, params.count)

    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        assert [x async for x in conn.subscribe("lenient", {"count": 2, "extra": True})] == [0, 1]


async def test_a_failing_factory_is_an_application_error_for_that_stream_only():
    server = demo_server()

    @server.publisher("broken")
    def broken(params, ctx):
        raise LookupError("factory bug")

    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        with pytest.raises(rsnet.StreamError, match="factory bug") as caught:
            async for _ in conn.subscribe("broken"):
                pass
        # The same code, message and data as a publisher failing with it (error_frame_fields).
        assert caught.value.code == ErrorCode.APPLICATION_ERROR
        assert (caught.value.message, caught.value.data) == ("LookupError: factory bug", {"type": "LookupError"})
        assert [x async for x in conn.subscribe("range", {"count": 2})] == [0, 1]


async def test_a_publisher_whose_subscribe_raises_ends_its_stream_only():
    """Rule 1.9: subscribe must signal, not raise. One that raises anyway (a bug, or a host
    refusing late with StreamError) ends its own stream with an ERROR; the connection and
    a stream already running on it carry on."""
    server = demo_server()

    class Raising(rsnet.Publisher):
        def __init__(self, error):
            self.error = error

        def subscribe(self, subscriber):
            raise self.error

    server.add_publisher("buggy", lambda params, ctx: Raising(TypeError("subscribe bug")))
    refusal = rsnet.StreamError(ErrorCode.REJECTED, "refused in subscribe")
    server.add_publisher("refusing", lambda params, ctx: Raising(refusal))
    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        async with conn.subscribe("range", {"count": 1000}, prefetch=10) as running_stream:
            assert await running_stream.__anext__() == 0
            with pytest.raises(rsnet.StreamError) as buggy:
                async for _ in conn.subscribe("buggy"):
                    pass
            assert buggy.value.code == ErrorCode.INTERNAL and "TypeError: subscribe bug" in buggy.value.message
            with pytest.raises(rsnet.StreamError) as refused:
                async for _ in conn.subscribe("refusing"):
                    pass
            assert (refused.value.code, refused.value.message) == (ErrorCode.REJECTED, "refused in subscribe")
            assert [x async for x in running_stream] == list(range(1, 1000))


async def test_wrong_or_missing_token_is_refused_with_unauthorized():
    async with running(demo_server(token="s3cret")) as urls:
        for token in (None, "wrong", b"s3cre"):
            with pytest.raises(HandshakeError) as caught:
                async with rsnet.connect(urls["tcp"], token=token):
                    pass
            assert caught.value.code == ErrorCode.UNAUTHORIZED
        async with rsnet.connect(urls["ws"], token="s3cret") as conn:
            assert [x async for x in conn.subscribe("range", {"count": 2})] == [0, 1]


async def test_remote_publisher_composes_with_operators():
    async with running(demo_server()) as urls, rsnet.connect(urls["tcp"]) as conn:
        remote = conn.publisher("range", {"count": 100})
        evens = remote.pipe(ops.filter(lambda x: x % 2 == 0), ops.map(lambda x: x * 10), ops.take(3))
        assert [x async for x in rsnet.iterate(evens, prefetch=4)] == [0, 20, 40]


async def test_cancel_travels_back_to_the_hosted_publisher():
    server, cancelled = endless_server()
    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        async with conn.subscribe("endless", prefetch=8) as items:
            async for item in items:
                if item == 100:
                    break
        with trio.fail_after(1):
            await cancelled.wait()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_waiting_consumer_gets_its_item_before_the_reader_reads_again(transport):
    """Latency: the reader that hands an item to a waiting ``async for`` lets that task run
    before it arms its next read, so the item is not delayed by a recv that finds nothing
    and an epoll registration (issue 13, target 1)."""
    async with running(demo_server()) as urls, rsnet.connect(urls[transport]) as conn:
        session = conn._session
        order: list[str] = []
        receive = session.transport.receive

        async def noted_receive():
            order.append("read armed")
            data = await receive()
            order.append("bytes")
            return data

        session.transport.receive = noted_receive
        # A window of 100: taking the first item asks for nothing, so the consumer has no
        # checkpoint between being woken and its loop body.
        async with conn.subscribe("range", {"count": 100}, prefetch=100) as items:
            async for _ in items:
                order.append("item")
                break
    # The item came in the last bytes read before it, and the reader had not read again.
    assert order[order.index("item") - 1] == "bytes"


async def test_a_slow_stream_does_not_delay_another_on_the_same_connection():
    server = demo_server()

    @server.publisher("slow")
    def slow(params, ctx):
        async def one_per_minute():
            while True:
                await trio.sleep(60)
                yield "late"

        return rsnet.from_async_iterable(one_per_minute, nursery=ctx.nursery)

    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        async with conn.subscribe("slow") as stuck:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stuck.__anext__)  # waits for an item that takes a minute
                with trio.fail_after(5):
                    assert len([x async for x in conn.subscribe("range", {"count": 10_000})]) == 10_000
                nursery.cancel_scope.cancel()


async def test_a_consumer_cancelled_while_waiting_can_wait_again_and_one_waits_at_a_time():
    """Cancelling a task that waits in ``__anext__`` leaves the stream usable (the next wait
    gets the next item); a second task waiting on the same stream at once is refused."""
    server = rsnet.Server()
    send, receive = trio.open_memory_channel[int](0)

    @server.publisher("gated")
    def gated(params, ctx):
        return rsnet.from_channel(receive.clone(), nursery=ctx.nursery)

    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        async with conn.subscribe("gated", prefetch=1) as items:
            with trio.move_on_after(0.05) as waited:
                await items.__anext__()  # nothing is sent: cancelled while it waits
            assert waited.cancelled_caught
            await send.send(1)
            with trio.fail_after(5):
                assert await items.__anext__() == 1
            async with trio.open_nursery() as nursery:
                nursery.start_soon(items.__anext__)  # waits for 2
                await trio.testing.wait_all_tasks_blocked()
                with pytest.raises(trio.BusyResourceError):
                    await items.__anext__()
                await send.send(2)  # the first waiter takes it and the nursery ends


async def test_offer_pushes_a_local_publisher_with_the_servers_demand_as_backpressure():
    received = []
    server = rsnet.Server()

    class Sink(rsnet.Subscriber):
        def on_subscribe(self, subscription):
            self.subscription = subscription
            subscription.request(2)

        def on_next(self, item):
            received.append(item)
            if len(received) % 2 == 0:
                self.subscription.request(2)

        def on_error(self, error):
            received.append(error)

        def on_complete(self):
            received.append("done")

    server.add_sink("uploads", lambda params, ctx: Sink())
    produced = []

    async def source():
        for i in range(50):
            produced.append(i)
            yield i

    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        async with trio.open_nursery() as nursery:
            await conn.offer("uploads", rsnet.from_async_iterable(source, nursery=nursery))
    assert received == [*range(50), "done"]


async def test_offer_to_an_unknown_name_is_rejected():
    async with running(demo_server()) as urls, rsnet.connect(urls["tcp"]) as conn:
        with pytest.raises(rsnet.StreamError) as caught:
            await conn.offer("nowhere", rsnet.just(1))
        assert caught.value.code == ErrorCode.UNKNOWN_PUBLISHER


async def test_server_death_ends_every_subscription_with_connection_lost():
    server, _ = endless_server(pause=0.01)

    async with trio.open_nursery() as outer:
        server_scope = trio.CancelScope()

        async def serve(task_status):
            with server_scope:
                await server.serve_tcp("127.0.0.1", 0, task_status=task_status)

        port = await outer.start(serve)
        async with rsnet.connect(f"tcp://127.0.0.1:{port}") as conn:
            errors = []

            async def consume():
                try:
                    async for _ in conn.subscribe("endless"):
                        pass
                except rsnet.ConnectionLost as lost:
                    assert conn.closed, "closed as soon as the streams hear of it"
                    errors.append(lost)

            async with trio.open_nursery() as consumers:
                for _ in range(3):
                    consumers.start_soon(consume)
                await trio.sleep(0.1)
                server_scope.cancel()  # the server dies: its sockets close under the client
                with trio.fail_after(5):
                    pass
            assert len(errors) == 3
            with pytest.raises(rsnet.ConnectionLost):
                async for _ in conn.subscribe("endless"):
                    pass


async def test_a_server_cancelled_while_a_stream_fails_ends_the_connection_not_the_stream():
    # The cancel lands while the server handles the client's bytes: the SUBSCRIBE's handler
    # (the reader task, now cancelled) fails the stream and goes on to write its answers.
    # Its stream error is the cancel's doing, as a producer's ProducerCancelledError is when
    # the cancel reaches it first: the client must see the connection end, as when the
    # process dies (it would retry that, not a stream error).
    server = rsnet.Server()
    server_scope = trio.CancelScope()

    @server.publisher("cancels-the-server")
    def cancels_the_server(params, ctx):
        server_scope.cancel()
        return rsnet.error(RuntimeError("failed by the server's own cancel"))

    async with trio.open_nursery() as outer:

        async def serve(task_status):
            with server_scope:
                await server.serve_tcp("127.0.0.1", 0, task_status=task_status)

        port = await outer.start(serve)
        async with rsnet.connect(f"tcp://127.0.0.1:{port}") as conn:
            with pytest.raises(rsnet.ConnectionLost):
                async for _ in conn.subscribe("cancels-the-server"):
                    pass


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_producer_cancelled_by_its_application_fails_the_remote_stream(transport):
    # Failed from a cancelled task, by the cancel of a nursery the application owns: the
    # session is not cancelled, so the ERROR goes out (from the writer, see _Outbound.on_error).
    server = demo_server()
    started = trio.Event()

    async def forever():
        started.set()
        await trio.sleep_forever()
        yield  # pragma: no cover (an async generator)

    async def own_producers(task_status):
        async with trio.open_nursery() as producers:
            task_status.started(producers)
            await trio.sleep_forever()

    async with trio.open_nursery() as outer:
        producers = await outer.start(own_producers)

        @server.publisher("owned")
        def owned(params, ctx):
            return rsnet.from_async_iterable(forever, nursery=producers)

        async with running(server) as urls, rsnet.connect(urls[transport]) as conn:
            errors = []

            async def consume():
                with pytest.raises(rsnet.StreamError) as caught:
                    async for _ in conn.subscribe("owned"):
                        pass
                errors.append(caught.value)

            with trio.fail_after(10):  # an error withheld for good would hang here
                async with trio.open_nursery() as consumer:
                    consumer.start_soon(consume)
                    await started.wait()
                    producers.cancel_scope.cancel()
            assert [error.code for error in errors] == [ErrorCode.APPLICATION_ERROR]
            assert "ProducerCancelledError" in errors[0].message
            assert not conn.closed


async def test_graceful_shutdown_lets_open_streams_finish_and_refuses_new_ones():
    server = demo_server()
    release = trio.Event()

    @server.publisher("gated")
    def gated(params, ctx):
        async def items():
            await release.wait()
            for i in range(3):
                yield i

        return rsnet.from_async_iterable(items, nursery=ctx.nursery)

    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        results = []

        async def consume():
            results.extend([x async for x in conn.subscribe("gated")])

        # Within 5 s of a 10 s grace: the client closes once its last stream ended (SPEC 10.2:
        # the receiver of GO_AWAY SHOULD), so the server's shutdown is not held to its deadline.
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume)
                await until(lambda: sum(s.stream_count for s in server.sessions) == 1)
                nursery.start_soon(server.shutdown, 10)
                await trio.sleep(0.05)
                # Refused as the server refuses an opening after GO_AWAY: a stream error with its
                # retryable code, not a lost connection (the connection drains its open stream).
                with pytest.raises(rsnet.StreamError) as refused:
                    async for _ in conn.subscribe("range", {"count": 1}):
                        pass
                assert refused.value.code == ErrorCode.GOING_AWAY and not conn.closed
                release.set()
        assert results == [0, 1, 2]  # the open stream drained before the connection closed
        assert not server.sessions


async def test_shutdown_deadline_cancels_streams_that_do_not_finish():
    server = rsnet.Server()
    cancelled = trio.Event()

    @server.publisher("forever")
    def forever(params, ctx):
        async def items():
            try:
                await trio.sleep_forever()
                yield 1
            finally:
                cancelled.set()

        return rsnet.from_async_iterable(items, nursery=ctx.nursery)

    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        errors = []

        async def consume():
            try:
                async for _ in conn.subscribe("forever"):
                    pass
            except rsnet.ConnectionLost as lost:
                errors.append(lost)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await until(lambda: sum(s.stream_count for s in server.sessions) == 1)
            nursery.start_soon(server.shutdown, 0.2)
        assert "GOING_AWAY" in str(errors[0])
        with trio.fail_after(1):
            await cancelled.wait()


async def until(condition, timeout=5.0):
    """Poll ``condition`` (for state another process or socket changes), bounded in time."""
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.005)


class _IgnoresDemand(rsnet.Publisher):
    """A broken publisher: emits 10 items whatever was requested (breaks rule 1.1)."""

    def subscribe(self, subscriber):
        class Subscription(rsnet.Subscription):
            def request(self, n):
                for i in range(10):
                    subscriber.on_next(i)

            def cancel(self):
                cancelled.append(True)

        cancelled = self.cancelled = []
        subscriber.on_subscribe(Subscription())


async def test_a_publisher_that_ignores_demand_is_cut_off_with_flow_control():
    broken = _IgnoresDemand()
    server = demo_server()
    server.add_publisher("broken", lambda params, ctx: broken)
    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        received = []
        with pytest.raises(rsnet.StreamError) as caught:
            async for item in conn.subscribe("broken", prefetch=4):
                received.append(item)
        assert caught.value.code == ErrorCode.FLOW_CONTROL
        assert received == [0, 1, 2, 3]  # what was requested arrived; nothing beyond it
        assert broken.cancelled  # and the publisher was cancelled, not buffered
        assert [x async for x in conn.subscribe("range", {"count": 3})] == [0, 1, 2]


async def test_reconnect_serves_new_subscriptions_after_the_server_comes_back():
    probe = trio.socket.socket()
    await probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    url = f"tcp://127.0.0.1:{port}"

    async def serve(task_status):
        with trio.CancelScope() as scope:
            task_status.started(scope)
            await demo_server().serve_tcp("127.0.0.1", port)

    async with trio.open_nursery() as nursery:
        first_server = await nursery.start(serve)
        async with rsnet.connect(url, reconnect=True, max_reconnect_delay=0.1) as conn:
            assert [x async for x in conn.subscribe("range", {"count": 2})] == [0, 1]
            first_server.cancel()  # the server goes away
            await until(lambda: conn._session.closed)
            waiting = []

            async def subscribe_while_down():
                waiting.extend([x async for x in conn.subscribe("range", {"count": 3})])

            nursery.start_soon(subscribe_while_down)
            await trio.sleep(0.2)
            assert waiting == []  # parked until there is a connection again
            await nursery.start(serve)  # the server is back on the same port
            await until(lambda: waiting == [0, 1, 2])
            assert [x async for x in conn.subscribe("range", {"count": 1})] == [0]
        nursery.cancel_scope.cancel()


async def test_reconnect_parks_a_subscription_made_while_the_server_drains():
    # A rolling restart: GO_AWAY, the old server drains, a new one listens. A subscription made
    # during the drain waits for the next connection instead of failing with GOING_AWAY.
    probe = trio.socket.socket()
    await probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    old, release = rsnet.Server(), trio.Event()

    @old.publisher("gated")
    def gated(params, ctx):
        async def items():
            await release.wait()
            yield "drained"

        return rsnet.from_async_iterable(items, nursery=ctx.nursery)

    async with trio.open_nursery() as nursery:
        await nursery.start(old.serve_tcp, "127.0.0.1", port)
        async with rsnet.connect(f"tcp://127.0.0.1:{port}", reconnect=True, max_reconnect_delay=0.05) as conn:
            drained, later = [], []

            async def consume(name, into):
                into.extend([x async for x in conn.subscribe(name, {"count": 2} if name == "range" else None)])

            nursery.start_soon(consume, "gated", drained)
            await until(lambda: sum(s.stream_count for s in old.sessions) == 1)
            nursery.start_soon(old.shutdown, 10)
            await until(lambda: conn._session.conn.going_away)
            nursery.start_soon(consume, "range", later)
            await trio.sleep(0.1)
            assert later == []  # parked: not refused, not sent on the draining connection
            release.set()
            await until(lambda: drained == ["drained"] and conn._session.closed)
            new = demo_server()
            await nursery.start(new.serve_tcp, "127.0.0.1", port)
            await until(lambda: later == [0, 1])
        nursery.cancel_scope.cancel()


async def test_without_reconnect_a_lost_connection_fails_new_subscriptions():
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def serve(task_status):
            with scope:
                await demo_server().serve_tcp("127.0.0.1", 0, task_status=task_status)

        port = await nursery.start(serve)
        async with rsnet.connect(f"tcp://127.0.0.1:{port}") as conn:
            scope.cancel()
            await until(lambda: conn._session.closed)
            with pytest.raises(rsnet.ConnectionLost):
                async for _ in conn.subscribe("range", {"count": 1}):
                    pass
        nursery.cancel_scope.cancel()


async def test_the_server_can_subscribe_to_a_publisher_the_client_hosts():
    client_side = rsnet.Server()  # used only as the client's host: a registry of publishers
    client_side.add_publisher("readings", lambda params, ctx: rsnet.range_(100, params["count"]))
    server = demo_server()
    async with running(server) as urls:
        for transport in TRANSPORTS:
            async with rsnet.connect(urls[transport], host=client_side):
                await until(lambda: len(server.sessions) == 1)
                (session,) = server.sessions
                remote = session.publisher("readings", {"count": 3})  # server -> client SUBSCRIBE
                assert [x async for x in rsnet.iterate(remote)] == [100, 101, 102]
                with pytest.raises(rsnet.StreamError) as caught:
                    async for _ in rsnet.iterate(session.publisher("unknown")):
                        pass
                assert caught.value.code == ErrorCode.UNKNOWN_PUBLISHER
            await until(lambda: not server.sessions)


async def test_both_clients_say_why_a_server_cannot_be_reached_in_the_same_words():
    # The trio client said "cannot connect to 127.0.0.1:P: all attempts to connect to
    # 127.0.0.1:P failed", the blocking one "[Errno 111] Connection refused".
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nobody listens there once it is closed
    expected = f"cannot connect to 127.0.0.1:{port}: Connection refused"
    with pytest.raises(rsnet.ConnectionLost) as trio_client:
        async with rsnet.connect(f"tcp://127.0.0.1:{port}"):
            pass
    with pytest.raises(rsnet.ConnectionLost) as blocking_client:
        with rsnet.sync.connect(f"tcp://127.0.0.1:{port}"):
            pass
    assert str(trio_client.value).endswith(expected) and str(blocking_client.value).endswith(expected)


async def test_both_clients_say_why_a_host_name_is_not_known_as_the_system_does():
    # An outside check: "cannot connect to no-such-host.invalid:7600: Unknown error -2" (the
    # lookup's EAI code read as an errno). ".invalid" never resolves (RFC 6761).
    with pytest.raises(socket.gaierror) as lookup:
        socket.getaddrinfo("no-such-host.invalid", 7600)
    expected = f"cannot connect to no-such-host.invalid:7600: {lookup.value.strerror}"
    with pytest.raises(rsnet.ConnectionLost) as trio_client:
        async with rsnet.connect("tcp://no-such-host.invalid:7600"):
            pass
    with pytest.raises(rsnet.ConnectionLost) as blocking_client:
        with rsnet.sync.connect("tcp://no-such-host.invalid:7600"):
            pass
    assert str(trio_client.value).endswith(expected) and str(blocking_client.value).endswith(expected)
    assert "Unknown error" not in expected
