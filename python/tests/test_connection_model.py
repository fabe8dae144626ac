"""Model-based property test: a parent core and a worker core talk through an arbitrarily chunked
pipe, driven by random but legal actions. No legal conversation may raise, credit never lets the
worker overrun the parent, and every request ends with exactly one terminal event at the parent."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from wirepool import proto

HELLO = proto.Hello(pid=1, max_concurrency=8, methods=[
    proto.MethodInfo("unary", proto.MethodKind.UNARY, [0, 1]),
    proto.MethodInfo("stream", proto.MethodKind.STREAM, [1])])
WELCOME = proto.Welcome(max_frame_size=65536, initial_credit=500, max_in_flight=4,
                        max_message_size=1 << 20)


class Pipe:
    """Bytes written by one core, delivered to the other in chunks the test chooses."""

    def __init__(self, receiver: proto.Connection) -> None:
        self.receiver = receiver
        self.pending = b""
        self.events: list[proto.Frame] = []

    def write(self, parts: list) -> None:
        self.pending += b"".join(bytes(p) for p in parts)

    def deliver(self, n: int) -> None:
        chunk, self.pending = self.pending[:n], self.pending[n:]
        self.receiver.receive(chunk)
        while (ev := self.receiver.next_event()) is not None:
            self.events.append(ev)


class Conversation(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.parent = proto.Connection("parent")
        self.worker = proto.Connection("worker")
        self.to_parent = Pipe(self.parent)
        self.to_worker = Pipe(self.worker)
        self.to_parent.write(self.worker.send_hello(HELLO))
        self.to_parent.deliver(1 << 30)
        self.to_worker.write(self.parent.send_welcome(WELCOME))
        self.to_worker.deliver(1 << 30)
        self.sent: dict[int, int] = {}  # request id -> kind, as the parent sent them
        self.terminals: dict[int, int] = {}  # request id -> terminal events seen by the parent
        self.running: dict[int, int] = {}  # worker side: accepted, not yet ended
        self.seen_worker_events = 0
        self.seen_parent_events = 0

    def _pump_worker_events(self) -> None:
        evs = self.to_worker.events[self.seen_worker_events:]
        self.seen_worker_events = len(self.to_worker.events)
        for ev in evs:
            if isinstance(ev, proto.Request):
                self.running[ev.id] = HELLO.methods[ev.method].kind
            elif isinstance(ev, proto.Reject):
                self.to_parent.write(self.worker.send_error(ev.id, ev.code))

    def _pump_parent_events(self) -> None:
        evs = self.to_parent.events[self.seen_parent_events:]
        self.seen_parent_events = len(self.to_parent.events)
        for ev in evs:
            if isinstance(ev, (proto.Result, proto.End, proto.ErrorFrame)) and ev.id:
                self.terminals[ev.id] = self.terminals.get(ev.id, 0) + 1
            elif isinstance(ev, proto.Rows):  # read at once: the core grants as its policy says
                granted, parts = self.parent.consumed(ev.id, ev.payload_size)
                assert bool(granted) == bool(parts)
                self.to_worker.write(parts)

    def _request(self, method: int, codec: int, body: bytes) -> None:
        id, parts = self.parent.send_request(method, codec, 0, body)
        assert id == len(self.sent) + 1  # the core allocates 1, 2, 3, ...
        self.to_worker.write(parts)
        self.sent[id] = method

    @precondition(lambda self: self.parent.can_send_request())
    @rule(body=st.binary(max_size=200_000), codec=st.sampled_from([0, 1]))
    def parent_calls_unary(self, body: bytes, codec: int) -> None:
        self._request(0, codec, body)

    @precondition(lambda self: self.parent.can_send_request())
    @rule(body=st.binary(max_size=100))
    def parent_starts_stream(self, body: bytes) -> None:
        self._request(1, 1, body)

    @precondition(lambda self: self.parent.can_send_request())
    @rule(method=st.sampled_from([0, 1]))
    def parent_sends_a_request_the_worker_refuses(self, method: int) -> None:
        self._request(method, 2, b"")  # codec 2 is accepted by neither: CODEC_UNSUPPORTED

    @rule(n=st.integers(1, 70_000))
    def deliver_to_worker(self, n: int) -> None:
        self.to_worker.deliver(n)
        self._pump_worker_events()

    @rule(n=st.integers(1, 70_000))
    def deliver_to_parent(self, n: int) -> None:
        self.to_parent.deliver(n)
        self._pump_parent_events()

    @rule(data=st.data(), size=st.integers(0, 300))
    def worker_sends_rows(self, data: st.DataObject, size: int) -> None:
        streams = [i for i, k in self.running.items() if k == proto.MethodKind.STREAM
                   and self.worker.credit(i) > 0]
        if not streams:
            return
        id = data.draw(st.sampled_from(streams))
        b = self.worker.rows(id)
        assert b.append(b"r" * size)
        self.to_parent.write(b.finish())

    @rule(data=st.data(), body=st.binary(max_size=150_000))
    def worker_ends_a_request(self, data: st.DataObject, body: bytes) -> None:
        if not self.running:
            return
        id = data.draw(st.sampled_from(sorted(self.running)))
        kind = self.running.pop(id)
        if kind == proto.MethodKind.UNARY:
            self.to_parent.write(self.worker.send_result(id, body))
        else:
            self.to_parent.write(self.worker.send_end(id, body))

    @rule(data=st.data())
    def worker_fails_a_request(self, data: st.DataObject) -> None:
        if not self.running:
            return
        id = data.draw(st.sampled_from(sorted(self.running)))
        del self.running[id]
        self.to_parent.write(self.worker.send_error(id, 203, "boom", '{"x":1}'))

    @rule(data=st.data(), grant=st.integers(1, 2000))
    def parent_grants_credit(self, data: st.DataObject, grant: int) -> None:
        streams = [i for i in self.parent.in_flight_ids()
                   if self.sent[i] == 1 and self.parent.credit(i) + grant <= proto.MAX_CREDIT]
        if streams:
            id = data.draw(st.sampled_from(streams))
            self.to_worker.write(self.parent.send_credit(id, grant))

    @rule(data=st.data())
    def parent_cancels(self, data: st.DataObject) -> None:
        if self.parent.in_flight():
            id = data.draw(st.sampled_from(self.parent.in_flight_ids()))
            self.to_worker.write(self.parent.send_cancel(id))

    @rule()
    def worker_pings(self) -> None:
        self.to_parent.write(self.worker.send_ping(b"12345678"))

    @invariant()
    def parent_credit_never_below_worker_credit(self) -> None:
        for id in self.worker.in_flight_ids():
            if self.running.get(id) == proto.MethodKind.STREAM and self.parent.is_in_flight(id):
                assert self.parent.credit(id) >= self.worker.credit(id)

    @invariant()
    def at_most_one_terminal_per_request(self) -> None:
        assert all(n == 1 for n in self.terminals.values())

    def teardown(self) -> None:
        # Let everything in flight arrive, let the worker end what it runs: every request the
        # parent sent has exactly one terminal.
        for _ in range(3):
            self.to_worker.deliver(1 << 30)
            self._pump_worker_events()
            for id in sorted(self.running):
                self.worker_fail(id)
            self.to_parent.deliver(1 << 30)
            self._pump_parent_events()
        assert set(self.terminals) == set(self.sent)
        assert not self.parent.in_flight()

    def worker_fail(self, id: int) -> None:
        del self.running[id]
        self.to_parent.write(self.worker.send_error(id, 205))


Conversation.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestConversation = Conversation.TestCase
